// Ring attention (context parallelism) against one rank's causal attention on the same
// sequence, forward and backward, with the time each rank waited for the ring's transfers
// after its computation (exposed). Every rank first runs the whole sequence's causal
// attention at once (both cores busy, as in the ring), then its ring share.
//   mpiexec -n 2 --bind-to core build/bin/bench_ring_attention --seq-len 8192
#include <fmt/format.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <vector>

#include "bench_common.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "pipetrain/model/ring_attention.hpp"

using namespace pipetrain;
using bench::median;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Tensor random_rows(MemoryPool& pool, int64_t rows, int64_t cols, uint64_t seed) {
  Tensor t = Tensor::empty(pool, {rows, cols});
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(rng.normal());
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  pipetrain::select_blas_kernel(argv);
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    KokkosSession kokkos(argc, argv);
    int T = 8192, heads = 4, hs = 32, steps = 3;
    CLI::App app{"ring attention over the world's ranks against one rank's causal attention"};
    app.add_option("--seq-len", T);
    app.add_option("--heads", heads);
    app.add_option("--head-size", hs);
    app.add_option("--steps", steps);
    CLI11_PARSE(app, argc, argv);
    auto be = make_cpu_backend();
    auto pool = MemoryPool::create(*be);
    const int C = heads * hs, R = 3 * C;
    MpiCommunicator comm(MPI_COMM_WORLD, "cp");
    const Tensor qkv = random_rows(*pool, T, R, 1), dout = random_rows(*pool, T, C, 2);
    const Tensor out = Tensor::empty(*pool, {T, C}), dqkv = Tensor::empty(*pool, {T, R});
    RingAttention ring(comm, *be, *pool, 1, T, heads, heads, hs);
    const int Tl = T / size;
    const Tensor lq = random_rows(*pool, Tl, R, 3 + rank), ld = random_rows(*pool, Tl, C, 9 + rank);
    const Tensor lo = Tensor::empty(*pool, {Tl, C}), ldq = Tensor::empty(*pool, {Tl, R});
    std::vector<double> one, ringed, waited;
    for (int s = 0; s <= steps; ++s) {  // step 0 warms up
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = std::chrono::steady_clock::now();
      {
        auto stash = be->attention_forward(out.f32(), qkv.f32(), 1, T, C, heads, heads, *pool, DType::F32);
        be->attention_backward(dqkv.f32(), dout.f32(), qkv.f32(), *stash, 1, T, C, heads, heads, *pool);
      }
      const double a = seconds_since(t0);
      MPI_Barrier(MPI_COMM_WORLD);
      const double w0 = ring.waited_seconds();
      t0 = std::chrono::steady_clock::now();
      ring.forward(lq, lo);
      ring.backward(lq, ld, ldq);
      double b = seconds_since(t0), w = ring.waited_seconds() - w0;
      MPI_Allreduce(MPI_IN_PLACE, &b, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (s == 0) continue;
      one.push_back(a), ringed.push_back(b), waited.push_back(w);
    }
    const double a = bench::mean_over_ranks(median(one)), b = median(ringed), w = median(waited);
    if (rank == 0)
      fmt::print(
          "T {} , {} heads of {}: one rank's causal attention (forward + backward, every rank at once) {:.3f} s; the "
          "ring over {} ranks {:.3f} s = {:.2f} x; waited for the ring's transfers after computing (the rank with "
          "most) {:.4f} s = {:.1f}% of the ring; medians of {} steps\n",
          T, heads, hs, a, size, b, b / a, w, 100 * w / b, steps);
  }
  MPI_Finalize();
  return 0;
}
