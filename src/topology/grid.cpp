#include "pipetrain/topology/grid.hpp"

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {
std::unique_ptr<MpiCommunicator> split(MPI_Comm parent, int color, int key, const char* name) {
  MPI_Comm c = MPI_COMM_NULL;
  if (MPI_Comm_split(parent, color, key, &c) != MPI_SUCCESS) fail("MPI_Comm_split for the {} communicator failed", name);
  return std::make_unique<MpiCommunicator>(c, name);
}
}  // namespace

Grid::Grid(MPI_Comm parent, const ParallelConfig& p, const std::string& src)
    : dp_(p.dp), pp_(p.pp), tp_(p.tp), cp_(p.cp), ep_(p.ep) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(parent, &dup);
  world_ = std::make_unique<MpiCommunicator>(dup, "world");
  const int size = world_->size();
  if (cp_ < 1) fail("{}{}parallel.cp ({}) must be >= 1", src, src.empty() ? "" : ": ", cp_);
  if (dp_ * pp_ * cp_ * tp_ != size)
    fail(
        "{}{}parallel.dp * parallel.pp * parallel.cp * parallel.tp = {} * {} * {} * {} = {} does not match the {} "
        "MPI ranks of this job",
        src, src.empty() ? "" : ": ", dp_, pp_, cp_, tp_, dp_ * pp_ * cp_ * tp_, size);
  if (ep_ < 1 || dp_ % ep_)
    fail("{}{}parallel.ep ({}) must divide parallel.dp ({}): the experts are split over dp ranks", src,
         src.empty() ? "" : ": ", ep_, dp_);
  const int r = world_->rank();
  me_.tp = r % tp_;
  me_.cp = (r / tp_) % cp_;
  me_.dp = (r / (tp_ * cp_)) % dp_;
  me_.pp = r / (tp_ * cp_ * dp_);
  const int replica = me_.dp * cp_ + me_.cp;  // (dp, cp): the ranks of one copy of the model
  tp_comm_ = split(dup, me_.pp * dp_ * cp_ + replica, me_.tp, "tp");
  dp_comm_ = split(dup, me_.pp * tp_ + me_.tp, replica, "dp");
  pp_comm_ = split(dup, replica * tp_ + me_.tp, me_.pp, "pp");
  replica_comm_ = split(dup, replica, me_.pp * tp_ + me_.tp, "replica");
  cp_comm_ = split(dup, (me_.pp * dp_ + me_.dp) * tp_ + me_.tp, me_.cp, "cp");
  // Expert groups: runs of ep consecutive dp ranks; the ranks holding the same experts are
  // those at the same place in every run (mixtures of experts run with cp = 1).
  const int stage_key = (me_.pp * tp_ + me_.tp) * cp_ + me_.cp;
  ep_comm_ = split(dup, stage_key * dp_ + me_.dp / ep_, me_.dp % ep_, "ep");
  ep_backward_comm_ = split(dup, stage_key * dp_ + me_.dp / ep_, me_.dp % ep_, "ep backward");
  expert_dp_comm_ = split(dup, stage_key * dp_ + me_.dp % ep_, me_.dp / ep_, "expert dp");
}

std::unique_ptr<MpiCommunicator> Grid::pair_comm(int first, int last, const std::string& name) {
  const int me = coords().pp;
  const bool in = first != last && (me == first || me == last);
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(pp_comm().comm(), in ? 0 : MPI_UNDEFINED, me, &c);
  return c == MPI_COMM_NULL ? nullptr : std::make_unique<MpiCommunicator>(c, name);
}

}  // namespace pipetrain
