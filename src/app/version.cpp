#include <H5public.h>
#include <mpi.h>

#include <fmt/format.h>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/bf16_products.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/backend/blas_threads.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/comm/nccl_communicator.hpp"
#include "pipetrain/core/fault.hpp"
#include "pipetrain/core/malloc_policy.hpp"
#include "pipetrain/core/runtime_env.hpp"

namespace pipetrain {

std::string version_text() {
  char mpi_lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(mpi_lib, &len);
  std::string mpi(mpi_lib, static_cast<size_t>(len));
  if (auto nl = mpi.find_first_of(",\n"); nl != std::string::npos) mpi.resize(nl);
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return fmt::format(
      "pipetrain {} (git {})\ncompiler: {}\nbackends: cpu (Kokkos {}, BLAS {}, {}; bf16 products: {}), cuda ({})\n"
      "MPI: {}\nNCCL: {}\nHDF5: {}.{}.{}{}\nmalloc: {}\nfault injection: {}",
      PIPETRAIN_VERSION, PIPETRAIN_GIT_REV, __VERSION__, kokkos_host_space_name(),
      blas_kernel_summary(), blas_threads_summary(), bf16_products_summary(), cuda_build_summary(), mpi, nccl_build_summary(), maj, min, rel,
#ifdef H5_HAVE_PARALLEL
      " (parallel)"
#else
      " (serial)"
#endif
      ,
      malloc_policy_summary(),
      fault::compiled_in ? "on (PIPETRAIN_FAULT, for tests)" : "off");
}

}  // namespace pipetrain
