#include "pipetrain/topology/node_comm.hpp"

namespace pipetrain {

NodeComm::NodeComm(MPI_Comm parent) {
  int rank = 0;
  MPI_Comm_rank(parent, &rank);
  MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &comm_);
  MPI_Comm_size(comm_, &size_);
}

NodeComm::~NodeComm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

}  // namespace pipetrain
