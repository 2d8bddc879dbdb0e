#include "pipetrain/io/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

void sync_path(const std::string& path, int flags, const char* what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open {} to sync it: {}", path, what, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on a directory (EINVAL): nothing more can be done there.
  if (rc != 0 && !(err == EINVAL && (flags & O_DIRECTORY)))
    fail("{}: fsync of the {} failed: {}", path, what, std::strerror(err));
}

}  // namespace

void sync_file(const std::string& path) { sync_path(path, O_RDONLY, "file"); }

void sync_directory(const std::string& dir) { sync_path(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY, "directory"); }

void durable_rename(const std::string& from, const std::string& to) {
  sync_file(from);
  publish(from, to);
}

void publish(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    fail("{}: cannot rename to {}: {}", from, to, std::strerror(errno));
  sync_directory(std::filesystem::path(to).parent_path().string());
}

void write_durably(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) fail("{}: cannot create: {}", tmp, std::strerror(errno));
      write(out);
      out.close();
      if (!out) fail("{}: write error (disk full?)", tmp);
    }
    durable_rename(tmp, path);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

}  // namespace pipetrain
