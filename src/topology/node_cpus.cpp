#include "pipetrain/topology/node_cpus.hpp"

#include "pipetrain/topology/node_comm.hpp"

#include <sched.h>

#include <vector>

namespace pipetrain {

NodeCpus node_cpus(MPI_Comm comm) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  NodeCpus out;
  if (sched_getaffinity(0, sizeof(mine), &mine) == 0) {
    out.cpus = CPU_COUNT(&mine);
  } else {  // no mask to read: one thread, and the mask counted as every CPU (shared with every rank)
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &mine);
    out.cpus = 1;
  }
  if (out.cpus < 1) out.cpus = 1;
  const NodeComm node(comm);
  std::vector<cpu_set_t> all(static_cast<size_t>(node.size()));
  MPI_Allgather(&mine, sizeof(cpu_set_t), MPI_BYTE, all.data(), sizeof(cpu_set_t), MPI_BYTE, node.comm());
  out.sharers = 0;
  for (auto& other : all) {
    cpu_set_t both;
    CPU_AND(&both, &mine, &other);
    if (CPU_COUNT(&both) > 0) ++out.sharers;
  }
  if (out.sharers < 1) out.sharers = 1;
  return out;
}

}  // namespace pipetrain
