// Benchmark: checkpoint write and read bandwidth (GPT-2 124M with AdamW moments) next
// to a plain sequential write and read of the same number of bytes to the same
// directory, in the same run. Both writes end with fsync; both files are dropped from
// the page cache before they are read back. Run on 1 rank and on 2 (pp = 2 splits the model):
//
//   mpiexec -n 1 build/bin/bench_checkpoint --dir /tmp/ckbench
//   mpiexec -n 2 build/bin/bench_checkpoint --dir /tmp/ckbench
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <vector>

#include "bench_common.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/runtime_env.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

using namespace pipetrain;
namespace fs = std::filesystem;

namespace {
double now() { return MPI_Wtime(); }

// Flushes a file to the disk and drops it from the page cache, so the next read comes
// from the disk (both the checkpoint and the plain file get the same treatment).
void sync_and_evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    KokkosSession kokkos(argc, argv);
    std::string dir = "ckbench";
    int layers = 12;
    CLI::App app{"checkpoint bandwidth vs a plain sequential write/read"};
    app.add_option("--dir", dir, "directory on the file system to measure");
    app.add_option("--layers", layers);
    if (auto rc = bench::parse_args(app, argc, argv)) return *rc;
    Config cfg;
    cfg.model.n_layer = layers;
    cfg.parallel.pp = size;
    cfg.train.global_batch = size;
    cfg.train.microbatches = size;
    auto backend = make_cpu_backend();
    Grid grid(MPI_COMM_WORLD, cfg.parallel);
    Trainer trainer(cfg, grid, *backend, [](int64_t, int, int32_t*, int32_t*) {});
    if (rank == 0) fs::create_directories(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string path = (fs::path(dir) / "bench_ckpt.h5").string();

    double t0 = now();
    trainer.save_checkpoint(path, 1);
    if (rank == 0) sync_and_evict(path);
    const double write_s = now() - t0;
    const double bytes = static_cast<double>(fs::file_size(path));
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now();
    trainer.load_checkpoint(path, false);
    MPI_Barrier(MPI_COMM_WORLD);
    const double read_s = now() - t0;

    double plain_w = 0, plain_r = 0;
    if (rank == 0) {  // the same bytes, one sequential stream
      const std::string plain = (fs::path(dir) / "bench_plain.bin").string();
      std::vector<char> buf(64 << 20, 1);
      t0 = now();
      {
        std::ofstream out(plain, std::ios::binary | std::ios::trunc);
        for (double left = bytes; left > 0; left -= static_cast<double>(buf.size()))
          out.write(buf.data(), static_cast<std::streamsize>(std::min<double>(left, static_cast<double>(buf.size()))));
      }
      sync_and_evict(plain);
      plain_w = now() - t0;
      t0 = now();
      {
        std::ifstream in(plain, std::ios::binary);
        while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
        }
      }
      plain_r = now() - t0;
      fs::remove(plain);
      fs::remove(path);
      const double gb = bytes / 1e9;
      fmt::print("GPT-2 {} layers + AdamW moments: {:.2f} GB checkpoint, {} rank(s) (pp = {})\n", layers, gb, size, size);
      fmt::print("write: checkpoint {:.2f} GB/s ({:.2f} s), plain sequential {:.2f} GB/s -> {:.0f}%\n", gb / write_s,
                 write_s, gb / plain_w, 100.0 * plain_w / write_s);
      fmt::print("read:  checkpoint {:.2f} GB/s ({:.2f} s), plain sequential {:.2f} GB/s -> {:.0f}%\n", gb / read_s,
                 read_s, gb / plain_r, 100.0 * plain_r / read_s);
    }
  }
  MPI_Finalize();
  return 0;
}
