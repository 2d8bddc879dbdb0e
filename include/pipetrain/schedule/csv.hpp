// Schedule files in PyTorch's compute-only CSV (torch.distributed.pipelining): one row
// per rank, comma-separated cells <stage><F|B|I|W><microbatch> such as "0F3", "1I2",
// "1W2", "2B0"; an empty cell is idle time and is skipped. pipetrain's one extension: an
// F cell ending in "&" ("0F3&,3B1") pairs it with the next cell, a B or I of another stage
// or an F that does not take its output, as a pair (Schedule::pairs) the executor overlaps.
// Exports: to_csv, from_csv, read_schedule_file, read_schedule_text, parse_placement.
// Compute+comms files (lowered programs): program_csv.hpp.
#pragma once
#include <string>
#include <vector>

#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

// One line per rank, cells in execution order, no idle cells.
std::string to_csv(const Schedule& s);

// Parses CSV text. `origin` names the source in errors ("x.csv: rank 1, column 3: bad
// cell \"2X0\""). `placement` is "loop", "v", or an explicit stage -> rank list "0,1,1,0".
// Ranks = rows (trailing blank lines ignored), stages and microbatches = largest index + 1
// (an explicit list fixes the stage count). Whitespace around cells is tolerated. The
// result is not validated: call validate().
Schedule from_csv(const std::string& text, const std::string& origin, const std::string& placement);

// Reads a file and parses it with from_csv (origin = path).
Schedule read_schedule_file(const std::string& path, const std::string& placement);
// The text of a schedule file; throws naming the path when it cannot be read.
std::string read_schedule_text(const std::string& path);

// Stage -> rank map for a placement spec ("loop", "v" or "0,1,1,0"); for an explicit
// list num_stages is ignored (the list length is the stage count).
std::vector<int> parse_placement(const std::string& placement, int num_stages, int num_ranks);

}  // namespace pipetrain
