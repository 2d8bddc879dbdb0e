// PyTorch compute-only CSV reading and writing (pipetrain/schedule/csv.hpp).
#include "pipetrain/schedule/csv.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

// Bounds on the indices a file may name (the stage map is sized by the largest stage).
constexpr int kMaxStage = 65535, kMaxMicrobatch = (1 << 24) - 1;

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 9 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "2F0" -> Action; false when the cell is not <digits><F|B|I|W><digits>.
bool parse_cell(const std::string& cell, Action& a) {
  size_t i = 0;
  while (i < cell.size() && std::isdigit(static_cast<unsigned char>(cell[i]))) ++i;
  if (i == 0 || i + 1 >= cell.size()) return false;
  const std::string stage = cell.substr(0, i), mb = cell.substr(i + 1);
  if (!all_digits(stage) || !all_digits(mb)) return false;
  switch (cell[i]) {
    case 'F': a.op = Op::F; break;
    case 'B': a.op = Op::B; break;
    case 'I': a.op = Op::I; break;
    case 'W': a.op = Op::W; break;
    default: return false;
  }
  a.stage = std::stoi(stage);
  a.microbatch = std::stoi(mb);
  return true;
}

}  // namespace

std::string to_csv(const Schedule& s) {
  std::string out;
  for (size_t r = 0; r < s.per_rank.size(); ++r) {
    const auto& prog = s.per_rank[r];
    if (prog.empty()) out += ',';  // an idle rank: one empty cell, not a blank line (which ends the file)
    for (size_t i = 0; i < prog.size(); ++i) {
      if (i > 0) out += ',';
      out += to_string(prog[i]);
      if (r < s.pairs.size() && std::count(s.pairs[r].begin(), s.pairs[r].end(), static_cast<int>(i))) out += '&';
    }
    out += '\n';
  }
  return out;
}

std::vector<int> parse_placement(const std::string& placement, int num_stages, int num_ranks) {
  const std::string p = trim(placement);
  if (p == "loop") return loop_placement(num_stages, num_ranks);
  if (p == "v") return v_placement(num_stages, num_ranks);
  std::vector<int> map;
  for (const auto& item : split(p, ',')) {
    const std::string t = trim(item);
    if (!all_digits(t))
      fail("placement \"{}\": expected \"loop\", \"v\" or a list of ranks like \"0,1,1,0\"",
           placement);
    map.push_back(std::stoi(t));
  }
  return map;
}

Schedule from_csv(const std::string& text, const std::string& origin, const std::string& placement) {
  std::vector<std::string> lines = split(text, '\n');
  for (auto& l : lines)
    if (!l.empty() && l.back() == '\r') l.pop_back();
  while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();
  if (lines.empty()) fail("{}: empty schedule file (expected one row per rank)", origin);

  Schedule s;
  s.name = origin;
  s.num_ranks = static_cast<int>(lines.size());
  s.per_rank.resize(lines.size());
  int max_stage = -1, max_mb = -1;
  for (size_t r = 0; r < lines.size(); ++r) {
    const auto cells = split(lines[r], ',');
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string cell = trim(cells[c]);
      if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"')
        cell = trim(cell.substr(1, cell.size() - 2));
      if (cell.empty()) continue;  // idle
      if (cell.back() == '&') {    // an overlapped pair with the next cell
        cell.pop_back();
        s.pairs.resize(lines.size());
        s.pairs[r].push_back(static_cast<int>(s.per_rank[r].size()));
      }
      Action a;
      if (!parse_cell(cell, a))
        fail("{}: rank {}, column {}: bad cell \"{}\" (expected <stage><F|B|I|W><microbatch>, "
             "e.g. 0F3)",
             origin, r, c + 1, cell);
      if (a.stage > kMaxStage || a.microbatch > kMaxMicrobatch)
        fail("{}: rank {}, column {}: cell \"{}\" is beyond the largest stage ({}) or microbatch ({}) a schedule "
             "may name",
             origin, r, c + 1, cell, kMaxStage, kMaxMicrobatch);
      max_stage = std::max(max_stage, a.stage);
      max_mb = std::max(max_mb, a.microbatch);
      s.per_rank[r].push_back(a);
    }
  }
  if (max_stage < 0) fail("{}: the schedule has no actions", origin);
  s.num_microbatches = max_mb + 1;
  try {
    s.stage_to_rank = parse_placement(placement, max_stage + 1, s.num_ranks);
  } catch (const Error& e) {
    fail("{}: {}", origin, e.what());
  }
  s.num_stages = static_cast<int>(s.stage_to_rank.size());
  if (s.num_stages <= max_stage)
    fail("{}: placement \"{}\" places {} stages, but the file uses stage {}", origin, placement,
         s.num_stages, max_stage);
  return s;
}

std::string read_schedule_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open schedule file", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

Schedule read_schedule_file(const std::string& path, const std::string& placement) {
  return from_csv(read_schedule_text(path), path, placement);
}

}  // namespace pipetrain
