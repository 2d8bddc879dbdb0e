#include "pipetrain/topology/node_memory.hpp"

#include <unistd.h>

#include "pipetrain/topology/node_comm.hpp"

#include <algorithm>
#include <fstream>
#include <string>

namespace pipetrain {

namespace {

// A cgroup's memory limit in bytes (v2 memory.max, v1 memory.limit_in_bytes); 0 = none found.
double cgroup_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string word;
    if (!(in >> word) || word == "max") continue;
    try {
      const double v = std::stod(word);
      if (v > 0) return v;
    } catch (const std::exception&) {
      // not a number: no limit read from this file
    }
  }
  return 0;
}

}  // namespace

double node_memory_per_rank(MPI_Comm comm) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  double bytes = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
  // v1 reports an unlimited group as a huge number: the smaller of the two is the bound.
  if (const double limit = cgroup_limit(); limit > 0) bytes = bytes > 0 ? std::min(bytes, limit) : limit;
  const NodeComm node(comm);
  double least = bytes;  // ranks of one node may read different limits (their own cgroups): the smallest
  MPI_Allreduce(&bytes, &least, 1, MPI_DOUBLE, MPI_MIN, node.comm());
  return least / node.size();
}

}  // namespace pipetrain
