#include "pipetrain/topology/grid.hpp"

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"

namespace pipetrain {

namespace {
// The groups the run talks over, in the order every rank splits them: the dimensions each
// spans, a second copy where one is needed, and its name in messages.
struct GroupSpec {
  const char* dims;
  int copy;
  const char* name;
};
constexpr GroupSpec kGroups[] = {{"tp", 0, "tp"},          {"dp-cp", 0, "dp"},     {"pp", 0, "pp"},
                                 {"pp-tp", 0, "replica"},  {"cp", 0, "cp"},        {"ep", 0, "ep"},
                                 {"ep", 1, "ep backward"}, {"edp", 0, "expert dp"}};
}  // namespace

Grid::Grid(MPI_Comm parent, const GridShape& shape, const std::string& src) : shape_(shape) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(parent, &dup);
  world_ = std::make_unique<MpiCommunicator>(dup, "world");
  if (auto problem = grid_shape_problem(shape_, world_->size()); !problem.empty())
    fail("{}{}{}", src, src.empty() ? "" : ": ", problem);
  const int r = world_->rank();
  me_ = shape_.coords_of(r);
  for (const GroupSpec& g : kGroups) {
    MPI_Comm c = MPI_COMM_NULL;
    if (MPI_Comm_split(dup, shape_.group_color(r, g.dims), shape_.group_rank(r, g.dims), &c) != MPI_SUCCESS)
      fail("MPI_Comm_split for the {} communicator failed", g.name);
    groups_.push_back({g.dims, g.copy, std::make_unique<MpiCommunicator>(c, g.name)});
  }
}

MpiCommunicator& Grid::comm(std::string_view dims, int copy) {
  for (auto& g : groups_)
    if (g.dims == dims && g.copy == copy) return *g.comm;
  fail("the grid builds no communicator over \"{}\" (copy {})", dims, copy);
}

std::unique_ptr<MpiCommunicator> Grid::pair_comm(int first, int last, const std::string& name) {
  const int me = coords().pp;
  const bool in = first != last && (me == first || me == last);
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(comm("pp").comm(), in ? 0 : MPI_UNDEFINED, me, &c);
  return c == MPI_COMM_NULL ? nullptr : std::make_unique<MpiCommunicator>(c, name);
}

}  // namespace pipetrain
