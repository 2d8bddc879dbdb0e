#include "pipetrain/core/runtime_env.hpp"

#include <Kokkos_Core.hpp>

namespace pipetrain {

KokkosSession::KokkosSession(int&, char**) {
  if (!Kokkos::is_initialized()) {
    // Kokkos sees no command-line arguments (it would answer --help itself); it
    // still reads its environment variables (OMP_NUM_THREADS, KOKKOS_*).
    char name[] = "pipetrain";
    char* args[] = {name, nullptr};
    int n = 1;
    Kokkos::initialize(n, args);
    owner_ = true;
  }
}

KokkosSession::~KokkosSession() {
  if (owner_ && Kokkos::is_initialized()) Kokkos::finalize();
}

const char* kokkos_host_space_name() { return Kokkos::DefaultHostExecutionSpace::name(); }

}  // namespace pipetrain
