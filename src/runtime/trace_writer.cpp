#include "pipetrain/runtime/trace_writer.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& local, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& e : local) {
    const bool wait = e.name.rfind("wait ", 0) == 0;
    mine.push_back({{"name", e.name},
                    {"cat", wait ? "wait" : "compute"},
                    {"ph", "X"},
                    {"pid", rank},
                    {"tid", 0},
                    {"ts", e.start_s * 1e6},
                    {"dur", e.dur_s * 1e6},
                    {"args", {{"step", e.step}}}});
  }
  const std::string text = mine.dump();
  int len = static_cast<int>(text.size());
  std::vector<int> lens(static_cast<size_t>(size)), offs(static_cast<size_t>(size));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm);
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) offs[static_cast<size_t>(r)] = total, total += lens[static_cast<size_t>(r)];
    all.resize(static_cast<size_t>(total));
  }
  MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, comm);
  if (rank != 0) return;
  nlohmann::json events = nlohmann::json::array();
  for (int r = 0; r < size; ++r) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    auto part = nlohmann::json::parse(all.substr(static_cast<size_t>(offs[static_cast<size_t>(r)]),
                                                 static_cast<size_t>(lens[static_cast<size_t>(r)])));
    for (auto& e : part) events.push_back(std::move(e));
  }
  std::ofstream out(path, std::ios::trunc);
  if (!out) fail("--trace: cannot write {}", path);
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << '\n';
}

}  // namespace pipetrain
