// dense_product_times and apply_dense_paths (pipetrain/runtime/product_timing.hpp).
#include "pipetrain/runtime/product_timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pipetrain/backend/blas_kernel.hpp"
#include "pipetrain/backend/blas_threads.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/durable_file.hpp"
#include "pipetrain/plan/cost_model.hpp"

namespace pipetrain {

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// What the times depend on besides the shapes: the node's CPU, the BLAS kernel, the
// threads, the rows.
std::string times_key(int rows) {
  return fmt::format("{} | BLAS {} | {} | {} rows", cpu_model(), blas_kernel_name(), blas_threads_summary(), rows);
}

nlohmann::json to_json(const DenseProductTimes& t) {
  return {{"out", t.shape.out}, {"in", t.shape.in}, {"rows", t.rows},         {"blas", t.blas},
          {"onednn", t.onednn}, {"packed", t.packed}, {"reorder", t.reorder}};
}

DenseProductTimes from_json(const nlohmann::json& j) {
  DenseProductTimes t;
  t.shape = {j.at("out").get<int>(), j.at("in").get<int>()};
  t.rows = j.at("rows").get<int>();
  t.blas = j.at("blas").get<std::array<double, 3>>();
  t.onednn = j.at("onednn").get<std::array<double, 3>>();
  t.packed = j.at("packed").get<std::array<double, 2>>();
  t.reorder = j.at("reorder").get<double>();
  return t;
}

// The cached times of `shapes` under `key`, or nothing (no file, another key, a shape missing).
std::vector<DenseProductTimes> read_cache(const std::string& path, const std::string& key,
                                          const std::vector<DenseShape>& shapes) {
  std::ifstream in(path);
  if (!in) return {};
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.at("key").get<std::string>() != key) return {};
    std::vector<DenseProductTimes> out;
    for (const DenseShape& s : shapes) {
      for (const auto& e : j.at("shapes"))
        if (from_json(e).shape == s) {
          out.push_back(from_json(e));
          break;
        }
      if (out.size() != static_cast<size_t>(&s - shapes.data()) + 1) return {};  // not kept
    }
    return out;
  } catch (const std::exception&) {
    return {};  // unreadable: timed afresh and rewritten
  }
}

void write_cache(const std::string& path, const std::string& key, const std::vector<DenseProductTimes>& times) {
  nlohmann::json j = {{"key", key}, {"shapes", nlohmann::json::array()}};
  for (const auto& t : times) j["shapes"].push_back(to_json(t));
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  write_durably(path, [&](std::ostream& o) { o << j.dump(1) << "\n"; });
}

std::vector<double> flatten(const std::vector<DenseProductTimes>& times) {
  std::vector<double> v;
  for (const auto& t : times) {
    v.insert(v.end(), t.blas.begin(), t.blas.end());
    v.insert(v.end(), t.onednn.begin(), t.onednn.end());
    v.insert(v.end(), t.packed.begin(), t.packed.end());
    v.push_back(t.reorder);
  }
  return v;
}

constexpr int kValuesPerShape = 9;

}  // namespace

void save_product_times(const std::string& path, int rows, const std::vector<DenseProductTimes>& times) {
  write_cache(path, times_key(rows), times);
}

std::string product_times_cache(const Config& cfg) {
  if (cfg.checkpoint.dir.empty()) return "";
  return (std::filesystem::path(cfg.checkpoint.dir) / "dense_product_times.json").string();
}

std::vector<DenseShapeUse> dense_product_times(const ModelConfig& model, int tp, Backend& backend, int rows,
                                               MPI_Comm world, const std::string& cache, std::string* source) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const int timed_rows = std::min(rows, kTimedRowsMax);
  const std::vector<DenseShapeCount> shapes = dense_weight_shapes(model, tp);
  std::vector<DenseShape> timed;  // each shape timed once (several weights may share a timed slice)
  for (const DenseShapeCount& s : shapes)
    if (std::find(timed.begin(), timed.end(), timed_shape(s.shape)) == timed.end()) timed.push_back(timed_shape(s.shape));
  std::vector<double> values(timed.size() * kValuesPerShape, -1.0);
  std::string said;
  int ok = 1;
  if (rank == 0) {
    try {
      const std::string key = times_key(timed_rows);
      std::vector<DenseProductTimes> times = cache.empty() ? std::vector<DenseProductTimes>{} : read_cache(cache, key, timed);
      if (!times.empty()) {
        said = "from " + cache;
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        for (const DenseShape& s : timed) {
          const auto t = backend.time_dense_products(s, timed_rows);
          if (!t) fail("the {} backend has one path for its dense products: nothing to time", backend.name());
          times.push_back(*t);
        }
        said = fmt::format("timed here in {:.2f} s",
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        if (!cache.empty()) write_cache(cache, key, times);
      }
      values = flatten(times);
    } catch (const std::exception& e) {
      ok = 0;
      said = e.what();
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, world);
  if (!ok) {
    if (rank == 0) fail("timing the dense products: {}", said);
    fail("timing the dense products failed on rank 0");
  }
  MPI_Bcast(values.data(), static_cast<int>(values.size()), MPI_DOUBLE, 0, world);
  std::vector<DenseShapeUse> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const size_t k = static_cast<size_t>(std::find(timed.begin(), timed.end(), timed_shape(shapes[i].shape)) - timed.begin());
    const double* v = values.data() + k * kValuesPerShape;
    DenseShapeUse u;
    u.shape = shapes[i].shape;
    u.count = shapes[i].count;
    u.times.shape = timed[k];
    u.times.rows = timed_rows;
    u.times.blas = {v[0], v[1], v[2]};
    u.times.onednn = {v[3], v[4], v[5]};
    u.times.packed = {v[6], v[7]};
    u.times.reorder = v[8];
    // A slice's products and reorders grow with its rows to the whole weight's. (Past
    // kTimedRowsMax rows the products' saving from packing, which is mostly the repacking
    // of W per call, is taken as timed: not scaled with the rows.)
    u.scale = static_cast<double>(shapes[i].shape.out) / timed[k].out;
    out.push_back(u);
  }
  if (source) *source = rank == 0 ? said : "rank 0's";
  return out;
}

DenseChoice apply_dense_paths(const Config& cfg, Backend& backend, int tp, int rows, int uses_per_step, MPI_Comm world,
                              const std::string& cache) {
  const std::string& asked = cfg.runtime.dense_products;
  const std::optional<ProductLibrary> library =
      asked == "auto" ? std::nullopt : std::optional<ProductLibrary>(parse_library(asked));
  const Toggle pack = cfg.runtime.pack_weights;
  const bool f32_products = !(cfg.train.precision == "bf16" && backend.bf16_products_native());
  DenseChoice c;
  const bool timed = cfg.runtime.device == "cpu" && f32_products && cfg.model.d_model >= kPackModelMin &&
                     (!library || pack == Toggle::Auto);
  if (timed) {
    std::string source;
    std::vector<DenseShapeUse> times = dense_product_times(cfg.model, tp, backend, rows, world, cache, &source);
    c = choose_dense_paths(times, library, pack, uses_per_step);
    c.why += " (times " + source + ")";
    c.from = std::move(times);
  } else {
    if (library) c.paths.library = {*library, *library, *library};
    if (cfg.runtime.device == "cpu" && !library)
      c.why = !f32_products ? "bf16 products read the bf16 weights"
                            : fmt::format("BLAS: d_model {} < {}, too small to time the paths apart", cfg.model.d_model,
                                          kPackModelMin);
  }
  if (!backend.set_dense_paths(c.paths))
    fail("runtime.dense_products = \"{}\": the {} backend cannot run its dense products in oneDNN (on the CPU that "
         "needs pipetrain built with oneDNN)",
         asked, cfg.runtime.device);
  if (pack == Toggle::On && !backend.set_pack_weights(true))
    fail("runtime.pack_weights = true: the {} backend cannot keep weights in its product library's layout (on the "
         "CPU that needs pipetrain built with oneDNN, and oneDNN's optimized f32 matmul on this CPU)",
         cfg.runtime.device);
  return c;
}

}  // namespace pipetrain
