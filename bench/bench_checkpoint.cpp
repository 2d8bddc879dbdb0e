// Benchmark: checkpoint write and read bandwidth (GPT-2 124M with AdamW moments) next
// to a plain sequential write and read of the same number of bytes to the same
// directory, in the same run. Both writes end with fsync; both files are dropped from
// the page cache before they are read back. Then `--resume auto` (pick the newest good
// checkpoint of two and load it) against that one read, and against the former way
// (rank 0 verifies every dataset, then all load), and with the newest one corrupt.
// Run on 1 rank and on 2 (pp = 2 splits the model; --dp puts the ranks in data
// parallel instead, --zero1 shards the moments):
//
//   mpiexec -n 1 build/bin/bench_checkpoint --dir /tmp/ckbench
//   mpiexec -n 2 build/bin/bench_checkpoint --dir /tmp/ckbench
//   mpiexec -n 2 build/bin/bench_checkpoint --dir /tmp/ckbench --dp [--zero1]
#include <fcntl.h>
#include <mpi.h>
#include <sys/resource.h>
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
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/runtime/resume.hpp"
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

// The process's peak resident memory so far (MiB).
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
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
    bool dp = false, zero1 = false;
    CLI::App app{"checkpoint bandwidth vs a plain sequential write/read"};
    app.add_option("--dir", dir, "directory on the file system to measure");
    app.add_option("--layers", layers);
    app.add_flag("--dp", dp, "ranks are data-parallel replicas (default: pipeline stages)");
    app.add_flag("--zero1", zero1, "ZeRO-1: moments sharded over the replicas (with --dp)");
    if (auto rc = bench::parse_args(app, argc, argv)) return *rc;
    Config cfg;
    cfg.model.n_layer = layers;
    (dp ? cfg.parallel.dp : cfg.parallel.pp) = size;
    cfg.parallel.zero1 = zero1;
    cfg.parallel.vocab_parallel = Toggle::Off;  // as RESULTS.md measured it: whole layers
    cfg.train.global_batch = size;
    cfg.train.microbatches = dp ? 1 : size;
    auto backend = make_cpu_backend();
    Grid grid(MPI_COMM_WORLD, cfg.parallel);
    Trainer trainer(cfg, grid, *backend, [](int64_t, int, int32_t*, int32_t*) {});
    if (rank == 0) fs::create_directories(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string path = (fs::path(dir) / "bench_ckpt.h5").string();

    const double rss_before = peak_rss_mib();
    const double pool_before = static_cast<double>(trainer.pool().stats().peak_in_use_bytes) / 1048576.0;
    double t0 = now();
    trainer.save_checkpoint(path, 1);
    if (rank == 0) sync_and_evict(path);
    const double write_s = now() - t0;
    const double rss_after = peak_rss_mib();
    const double pool_after = static_cast<double>(trainer.pool().stats().peak_in_use_bytes) / 1048576.0;
    const double bytes = static_cast<double>(fs::file_size(path));
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now();
    trainer.load_checkpoint(path, false);
    MPI_Barrier(MPI_COMM_WORLD);
    const double read_s = now() - t0;

    // --resume auto over two checkpoints (step 1 and the newest, step 2), from the disk.
    const std::string rdir = (fs::path(dir) / "resume").string();
    if (rank == 0) fs::create_directories(rdir);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string older = checkpoint_path(rdir, 1), newest = checkpoint_path(rdir, 2);
    trainer.save_checkpoint(older, 1);
    trainer.save_checkpoint(newest, 2);
    auto evict_all = [&] {
      if (rank == 0) sync_and_evict(older), sync_and_evict(newest);
      MPI_Barrier(MPI_COMM_WORLD);
    };
    evict_all();
    t0 = now();
    const ResumeResult picked = resume_newest(trainer, grid, rdir);
    MPI_Barrier(MPI_COMM_WORLD);
    const double auto_s = now() - t0;
    if (picked.path != newest) fmt::print(stderr, "resume picked {} instead of {}\n", picked.path, newest);
    evict_all();
    t0 = now();  // the former way: rank 0 reads and checks every dataset, then all load
    if (rank == 0) (void)verify_checkpoint(newest);
    MPI_Barrier(MPI_COMM_WORLD);
    trainer.load_checkpoint(newest, false);
    MPI_Barrier(MPI_COMM_WORLD);
    const double serial_s = now() - t0;
    if (rank == 0) {  // corrupt the newest one's middle: resume falls back to the older
      std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(fs::file_size(newest) / 2));
      const std::vector<char> junk(4096, '\xff');
      f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    }
    evict_all();
    t0 = now();
    const ResumeResult fallback = resume_newest(trainer, grid, rdir);
    MPI_Barrier(MPI_COMM_WORLD);
    const double corrupt_s = now() - t0;
    if (fallback.path != older) fmt::print(stderr, "resume picked {} instead of {}\n", fallback.path, older);
    double mem[4] = {pool_before, pool_after, rss_before, rss_after};
    MPI_Allreduce(MPI_IN_PLACE, mem, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

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
      fs::remove_all(rdir);
      const double gb = bytes / 1e9;
      fmt::print("GPT-2 {} layers + AdamW moments: {:.2f} GB checkpoint, {} rank(s) ({} = {}{}), BLAS {}\n", layers,
                 gb, size, dp ? "dp" : "pp", size, zero1 ? ", ZeRO-1" : "", blas_kernel_name());
      fmt::print("write: checkpoint {:.2f} GB/s ({:.2f} s), plain sequential {:.2f} GB/s -> {:.0f}%\n", gb / write_s,
                 write_s, gb / plain_w, 100.0 * plain_w / write_s);
      fmt::print("read:  checkpoint {:.2f} GB/s ({:.2f} s), plain sequential {:.2f} GB/s -> {:.0f}%\n", gb / read_s,
                 read_s, gb / plain_r, 100.0 * plain_r / read_s);
      fmt::print("resume auto (newest good of 2): {:.2f} s = {:.2f}x one read; former verify-then-load {:.2f} s = "
                 "{:.2f}x; newest corrupt, falls back: {:.2f} s = {:.2f}x\n",
                 auto_s, auto_s / read_s, serial_s, serial_s / read_s, corrupt_s, corrupt_s / read_s);
      fmt::print("memory per rank (largest): pooled {:.0f} MiB before the save, {:.0f} MiB peak after it; "
                 "peak RSS {:.0f} MiB before, {:.0f} MiB after\n",
                 mem[0], mem[1], mem[2], mem[3]);
    }
  }
  MPI_Finalize();
  return 0;
}
