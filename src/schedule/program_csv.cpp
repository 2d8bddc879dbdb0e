// Compute+comms CSV reading and writing (pipetrain/schedule/program_csv.hpp).
#include "pipetrain/schedule/program_csv.hpp"

#include <fmt/format.h>

#include <cctype>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/csv.hpp"

namespace pipetrain {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s)
    if (c == sep) out.emplace_back();
    else out.back() += c;
  return out;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string t = s.substr(b, e - b);
  if (t.size() >= 2 && t.front() == '"' && t.back() == '"') t = trim(t.substr(1, t.size() - 2));
  return t;
}

// "0SEND_F1" -> a transfer instruction without peer and tag; false if not a transfer cell.
bool parse_transfer(const std::string& cell, Instr& out, const std::string& where) {
  const size_t at = cell.find("SEND_") != std::string::npos ? cell.find("SEND_") : cell.find("RECV_");
  if (at == std::string::npos) return false;
  const std::string stage = cell.substr(0, at), rest = cell.substr(at + 5);
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 8 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(stage) || rest.size() < 2 || (rest[0] != 'F' && rest[0] != 'B') || !digits(rest.substr(1)))
    fail("{}: bad transfer cell \"{}\" (expected <stage>SEND_F<mb>, RECV_F, SEND_B or RECV_B, e.g. 0SEND_F1)", where,
         cell);
  const bool send = cell.compare(at, 5, "SEND_") == 0, forward = rest[0] == 'F';
  const int st = std::stoi(stage);
  out.op = send ? InstrOp::Send : InstrOp::Recv;
  out.kind = forward ? Transfer::Activation : Transfer::Gradient;
  out.microbatch = std::stoi(rest.substr(1));
  // SEND names the sending stage, RECV the receiving one; the program keys by the consumer.
  out.stage = send ? (forward ? st + 1 : st - 1) : st;
  return true;
}

}  // namespace

bool is_comms_csv(const std::string& text) {
  return text.find("SEND_") != std::string::npos || text.find("RECV_") != std::string::npos;
}

std::string to_comms_csv(const Program& p) {
  std::string out;
  for (const auto& prog : p.per_rank) {
    std::string row;
    for (const auto& i : prog) {
      if (i.op == InstrOp::Move) continue;
      if (!row.empty()) row += ',';
      row += to_string(i) + (i.overlaps_next ? "&" : "");
    }
    out += (row.empty() ? "," : row) + '\n';
  }
  return out;
}

Program program_from_csv(const std::string& text, const std::string& origin, const std::string& placement,
                         int tag_ub) {
  // The compute cells alone are a compute-only schedule; lowering it gives the compute
  // instructions, their MOVEs and frees, and the peers and tags of every transfer.
  std::vector<std::vector<std::string>> rows;
  std::string compute_text;
  for (std::string line : split(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    rows.emplace_back();
    std::string kept;
    for (const auto& raw : split(line, ',')) {
      const std::string cell = trim(raw);
      rows.back().push_back(cell);
      const bool transfer = is_comms_csv(cell);
      kept += (kept.empty() ? "" : ",") + (transfer ? std::string() : cell);
    }
    compute_text += kept + '\n';
  }
  const Schedule s = from_csv(compute_text, origin, placement);
  rows.resize(static_cast<size_t>(s.num_ranks));
  const Program lowered = lower(s, {1, tag_ub});
  Program p = lowered;
  auto rank_of = [&](int stage) { return s.stage_to_rank[static_cast<size_t>(stage)]; };
  const TagPlan tags(s.stage_to_rank, s.num_microbatches, lowered.backward, tag_ub);
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& lowered_rank = lowered.per_rank[static_cast<size_t>(r)];
    auto& out = p.per_rank[static_cast<size_t>(r)];
    out.clear();
    size_t next = 0;  // position in lowered_rank
    const auto& cells = rows[static_cast<size_t>(r)];
    for (size_t c = 0; c < cells.size(); ++c) {
      if (cells[c].empty()) continue;
      Instr t;
      if (parse_transfer(cells[c], t, fmt::format("{}: rank {}, column {}", origin, r, c + 1))) {
        const int producer = producer_stage(t);
        if (t.stage >= 0 && t.stage < s.num_stages && producer >= 0 && producer < s.num_stages) {
          t.peer = rank_of(t.op == InstrOp::Send ? t.stage : producer);
          try {
            t.tag = tags.tag(t.kind, t.microbatch, t.stage);
          } catch (const Error&) {
            t.tag = -1;  // no such transfer: validate_program says where
          }
        }
        out.push_back(t);
        continue;
      }
      // A compute cell: the next compute of the lowered rank, with the MOVE after it.
      while (next < lowered_rank.size() && lowered_rank[next].op != InstrOp::Compute) ++next;
      out.push_back(lowered_rank[next++]);
      while (next < lowered_rank.size() && lowered_rank[next].op != InstrOp::Compute) {
        if (lowered_rank[next].op == InstrOp::Move) out.push_back(lowered_rank[next]);
        ++next;
      }
    }
  }
  p.name = origin;
  return p;
}

Schedule compute_only(const Program& p) {
  Schedule s;
  s.name = p.name;
  s.num_stages = p.num_stages;
  s.num_ranks = p.num_ranks;
  s.num_microbatches = p.num_microbatches;
  s.stage_to_rank = p.stage_to_rank;
  s.per_rank.resize(p.per_rank.size());
  s.pairs.resize(p.per_rank.size());
  for (size_t r = 0; r < p.per_rank.size(); ++r)
    for (const auto& i : p.per_rank[r]) {
      if (i.op != InstrOp::Compute) continue;
      if (i.overlaps_next) s.pairs[r].push_back(static_cast<int>(s.per_rank[r].size()));
      s.per_rank[r].push_back(i.action);
    }
  return s;
}

}  // namespace pipetrain
