// render_chrome_trace() of pipetrain/schedule/render.hpp: Chrome-trace JSON.
#include <nlohmann/json.hpp>

#include "pipetrain/schedule/render.hpp"

namespace pipetrain {

std::string render_chrome_trace(const Schedule& s, const SimResult& r) {
  constexpr double kMicrosPerUnit = 1000;  // one cost unit = 1 ms on the trace's clock
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0},
                    {"args", {{"name", s.name.empty() ? std::string("schedule") : s.name}}}});
  for (int rank = 0; rank < s.num_ranks; ++rank)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", rank},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
  for (const auto& e : r.events) {
    events.push_back({{"name", e.name()},
                      {"cat", std::string(1, e.category())},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", e.rank},
                      {"ts", e.start * kMicrosPerUnit},
                      {"dur", (e.end - e.start) * kMicrosPerUnit},
                      {"args",
                       {{"stage", e.action.stage}, {"microbatch", e.action.microbatch}}}});
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump() + "\n";
}

}  // namespace pipetrain
