#include "pipetrain/core/fault.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <thread>

#include <fmt/ranges.h>

#include "pipetrain/core/error.hpp"

namespace pipetrain::fault {

const std::vector<std::string>& point_names() {
  static const std::vector<std::string> names = {"forward", "backward",         "p2p-wait", "collective",
                                                 "optimizer", "checkpoint-write", "eval", "blas-check"};
  return names;
}

#if PIPETRAIN_FAULT_INJECTION

namespace {

enum class Kind { Throw, Oom, Hang, Kill };

struct Armed {
  std::string point;
  Kind kind = Kind::Throw;
  long at = 1;     // fire on this occurrence
  long seen = 0;   // occurrences so far
  int rank = 0;
};

std::vector<Armed>& armed() {
  static std::vector<Armed> a;
  return a;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

long parse_number(const std::string& text, const std::string& spec, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0)
    fail("PIPETRAIN_FAULT: '{}': {} '{}' is not a non-negative integer", spec, what, text);
  return v;
}

Armed parse_one(const std::string& spec) {
  const auto f = split(spec, ':');
  if (f.size() != 3 && f.size() != 4)
    fail("PIPETRAIN_FAULT: '{}' is not RANK:POINT:KIND[:N] (KIND = throw|oom|hang|kill)", spec);
  Armed a;
  a.rank = static_cast<int>(parse_number(f[0], spec, "rank"));
  a.point = f[1];
  const auto& names = point_names();
  if (std::find(names.begin(), names.end(), a.point) == names.end())
    fail("PIPETRAIN_FAULT: '{}': unknown point '{}' (points: {})", spec, a.point, fmt::join(names, ", "));
  if (f[2] == "throw") a.kind = Kind::Throw;
  else if (f[2] == "oom") a.kind = Kind::Oom;
  else if (f[2] == "hang") a.kind = Kind::Hang;
  else if (f[2] == "kill") a.kind = Kind::Kill;
  else fail("PIPETRAIN_FAULT: '{}': unknown kind '{}' (throw, oom, hang, kill)", spec, f[2]);
  if (f.size() == 4) a.at = parse_number(f[3], spec, "occurrence");
  if (a.at < 1) fail("PIPETRAIN_FAULT: '{}': the occurrence counts from 1", spec);
  return a;
}

[[noreturn]] void fire(const Armed& a) {
  const std::string where = fmt::format("injected fault at {} (rank {}, occurrence {})", a.point, a.rank, a.at);
  switch (a.kind) {
    case Kind::Throw: throw Error(where);
    case Kind::Oom:
      std::fprintf(stderr, "pipetrain: %s: allocation failure\n", where.c_str());
      throw std::bad_alloc();
    case Kind::Hang:
      std::fprintf(stderr, "pipetrain: %s: hanging\n", where.c_str());
      std::fflush(stderr);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    case Kind::Kill:
      std::fprintf(stderr, "pipetrain: %s: killing the process\n", where.c_str());
      std::fflush(stderr);
      std::raise(SIGKILL);
  }
  std::abort();
}

}  // namespace

namespace detail {
bool g_armed = false;

void reached(std::string_view point) {
  for (auto& a : armed())
    if (a.point == point && ++a.seen == a.at) fire(a);
}
}  // namespace detail

void arm(const std::string& spec, int world_rank) {
  armed().clear();
  detail::g_armed = false;
  if (spec.empty()) return;
  for (const auto& one : split(spec, ',')) {
    Armed a = parse_one(one);
    if (a.rank == world_rank) armed().push_back(std::move(a));
  }
  detail::g_armed = !armed().empty();
}

void arm_from_environment(int world_rank) {
  const char* spec = std::getenv("PIPETRAIN_FAULT");
  arm(spec ? spec : "", world_rank);
}

#endif

}  // namespace pipetrain::fault
