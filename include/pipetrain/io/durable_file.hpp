// Publishing files so that a crash never leaves a name whose bytes are not on disk:
// write under a temporary name, fsync it, rename it into place, fsync the directory
// (the rename itself is only durable once the directory entry is).
#pragma once
#include <functional>
#include <ostream>
#include <string>

namespace pipetrain {

// fsync(2) of an existing file (its data and metadata reach the device; on a parallel
// file system, this client's cached writes reach the servers). Throws naming the file.
void sync_file(const std::string& path);
// fsync(2) of a directory: makes renames and creations inside it durable.
void sync_directory(const std::string& dir);
// sync_file(from), then publish(from, to).
void durable_rename(const std::string& from, const std::string& to);
// rename(from, to), sync_directory(parent of to): for a file already synced.
void publish(const std::string& from, const std::string& to);
// Writes `path` durably: `write` fills PATH.tmp, which is checked, synced and renamed into
// place; on any failure (a throw from `write`, a full disk) the temporary is removed and
// the error, naming the file, propagates. An existing `path` is untouched until the rename.
void write_durably(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace pipetrain
