#include "pipetrain/core/runtime_env.hpp"

#include <Kokkos_Core.hpp>

namespace pipetrain {

KokkosSession::KokkosSession(int& argc, char** argv) {
  if (!Kokkos::is_initialized()) {
    Kokkos::initialize(argc, argv);
    owner_ = true;
  }
}

KokkosSession::~KokkosSession() {
  if (owner_ && Kokkos::is_initialized()) Kokkos::finalize();
}

const char* kokkos_host_space_name() { return Kokkos::DefaultHostExecutionSpace::name(); }

}  // namespace pipetrain
