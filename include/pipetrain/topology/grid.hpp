// The process grid (core/grid_shape.hpp) on MPI: every group of ranks the run talks
// over, split once out of a parent communicator (normally MPI_COMM_WORLD) by one rule
// (GridShape::group_color) and obtained by the names of the dimensions it spans:
//   comm("tp")     a stage's tensor-parallel peers
//   comm("dp-cp")  the ranks holding the same parameters (gradients summed, ZeRO-1's shares)
//   comm("pp")     the pipeline (rank = pipeline index)
//   comm("pp-tp")  one model replica
//   comm("cp")     one sequence's ring
//   comm("ep")     the dp ranks that split each MoE layer's experts (rank = dp % ep);
//                  comm("ep", 1) is a second communicator over them for the backward's
//                  exchanges, so an F&B pair's two directions post in either order
//   comm("edp")    the dp ranks holding the same experts (rank = dp / ep)
// The communicators are passed explicitly to whoever needs them; nothing is global.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pipetrain/comm/mpi_communicator.hpp"
#include "pipetrain/core/grid_shape.hpp"

namespace pipetrain {

class Grid {
 public:
  // Throws (on every rank) when the shape breaks a grid rule or its ranks differ from the
  // parent's size; `config_source` names the config in the message.
  Grid(MPI_Comm parent, const GridShape& shape, const std::string& config_source = "");

  const GridShape& shape() const { return shape_; }
  const GridCoords& coords() const { return me_; }
  int world_rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }

  MpiCommunicator& world() { return *world_; }
  // The group spanning `dims` ("dp-cp", ...; see above), `copy` 0 or, for "ep", 1.
  // Throws pipetrain::Error for a group the grid does not build.
  MpiCommunicator& comm(std::string_view dims, int copy = 0);
  // Collective over comm("pp"): the pipeline ranks `first` and `last` (which hold the two
  // copies of a tied embedding), or null on the other ranks and when first == last.
  std::unique_ptr<MpiCommunicator> pair_comm(int first, int last, const std::string& name);

 private:
  struct Group {
    std::string dims;
    int copy;
    std::unique_ptr<MpiCommunicator> comm;
  };
  GridShape shape_;
  GridCoords me_;
  std::unique_ptr<MpiCommunicator> world_;
  std::vector<Group> groups_;
};

}  // namespace pipetrain
