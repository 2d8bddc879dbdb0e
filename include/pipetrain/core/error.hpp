// pipetrain::Error — the one exception type for user-actionable failures.
// main() catches it, prints the message once and ends the whole MPI job.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace pipetrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Throws pipetrain::Error with an fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace pipetrain
