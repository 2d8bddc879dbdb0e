// The ranks of a communicator that share this rank's node (MPI_COMM_TYPE_SHARED), as a
// communicator freed when it goes out of scope. What node_cpus and node_memory ask.
//
// Exports: NodeComm.
#pragma once
#include <mpi.h>

namespace pipetrain {

class NodeComm {
 public:
  explicit NodeComm(MPI_Comm parent);  // collective over `parent`
  ~NodeComm();
  NodeComm(const NodeComm&) = delete;
  NodeComm& operator=(const NodeComm&) = delete;
  MPI_Comm comm() const { return comm_; }
  int size() const { return size_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 1;
};

}  // namespace pipetrain
