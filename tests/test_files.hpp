// Shared by the file-format and schedule tests: a fresh temporary directory per test, the
// check that a call throws one pipetrain::Error line containing given parts, and the
// message a call throws.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>

#include "pipetrain/core/error.hpp"

namespace pipetrain::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = std::filesystem::temp_directory_path() / fmt::format("pipetrain_test_{}_{}", ::getpid(), counter++);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  std::filesystem::path dir_;
};

inline void expect_one_line_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no pipetrain::Error thrown; expected one containing " << *parts.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " lacks " << p;
  }
}

// The message of the pipetrain::Error `f` throws; "(no error)" where it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace pipetrain::testing
