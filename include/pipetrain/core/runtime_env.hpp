// Process-wide runtime set-up shared by the command, tests and benchmarks.
#pragma once

namespace pipetrain {

// RAII: initialises Kokkos (host execution space) once, finalises at scope exit.
class KokkosSession {
 public:
  KokkosSession(int& argc, char** argv);
  ~KokkosSession();
  KokkosSession(const KokkosSession&) = delete;
  KokkosSession& operator=(const KokkosSession&) = delete;

 private:
  bool owner_ = false;
};

// Name of Kokkos' default host execution space ("Serial", "OpenMP", ...).
const char* kokkos_host_space_name();

}  // namespace pipetrain
