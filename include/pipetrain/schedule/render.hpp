// Views of a simulated schedule. Exports: render_text, render_chrome_trace (the SVG
// timeline is drawn by the report's chart code: svg_schedule in app/svg_plot.hpp).
#pragma once
#include <string>

#include "pipetrain/schedule/schedule.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

// Text grid: one row per rank, one column per time slot (slot = the shortest action
// duration). An action shows its cell ("0F3") in its first slot and "-" in the slots it
// continues into; idle slots show ".".
std::string render_text(const Schedule& s, const SimResult& r);

// Chrome-trace JSON ({"traceEvents": [...]}, opens in Perfetto / chrome://tracing):
// one complete ("X") event per action, pid 0, tid = rank, 1 time unit = 1 ms.
std::string render_chrome_trace(const Schedule& s, const SimResult& r);

}  // namespace pipetrain
