#include "pipetrain/topology/device_comms.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "pipetrain/comm/nccl_communicator.hpp"
#include "pipetrain/comm/staged_communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

MPI_Comm dup(const MpiCommunicator& c) {
  MPI_Comm out = MPI_COMM_NULL;
  MPI_Comm_dup(c.comm(), &out);
  return out;
}

// The first two ranks of `group` on the same GPU, and its identity (collective over the
// group: every rank gets the same answer).
std::optional<std::pair<std::pair<int, int>, std::string>> shared_gpu(const MpiCommunicator& group,
                                                                      const DeviceAllocator& device) {
  constexpr size_t kWidth = MPI_MAX_PROCESSOR_NAME + 32;
  std::string mine = gpu_identity(device);
  mine.resize(kWidth, '\0');
  std::vector<char> all(kWidth * static_cast<size_t>(group.size()));
  MPI_Allgather(mine.data(), static_cast<int>(kWidth), MPI_CHAR, all.data(), static_cast<int>(kWidth), MPI_CHAR,
                group.comm());
  std::vector<std::string> ids;
  for (int r = 0; r < group.size(); ++r) ids.emplace_back(all.data() + kWidth * static_cast<size_t>(r));
  if (const auto shared = ranks_sharing_a_gpu(ids)) return std::pair{*shared, ids[static_cast<size_t>(shared->first)]};
  return std::nullopt;
}

// NCCL runs one rank per GPU: refuses (on every rank of `group`) two ranks of the group on
// the same GPU.
// `p2p`: the group is one comm.p2p chooses for (the message then says how to share a GPU).
void check_distinct_gpus(const MpiCommunicator& group, const DeviceAllocator& device, const std::string& what,
                         bool p2p) {
  if (const auto shared = shared_gpu(group, device))
    fail(
        "{} over NCCL: ranks {} and {} of the {} group share GPU {} (NCCL needs one GPU per rank; start one rank "
        "per GPU{})",
        what, shared->first.first, shared->first.second, group.name(), shared->second,
        p2p ? ", or set comm.p2p = \"mpi\"" : "");
}

}  // namespace

std::string gpu_identity(const DeviceAllocator& device) {
  if (std::string id = device.hardware_id(); !id.empty()) return id;
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  return fmt::format("{}:cuda:{}", std::string_view(host, static_cast<size_t>(len)), device.device().index);
}

std::optional<std::pair<int, int>> ranks_sharing_a_gpu(const std::vector<std::string>& ids) {
  for (size_t a = 0; a < ids.size(); ++a)
    for (size_t b = a + 1; b < ids.size(); ++b)
      if (ids[a] == ids[b]) return std::pair{static_cast<int>(a), static_cast<int>(b)};
  return std::nullopt;
}

DeviceComms::DeviceComms(Grid& grid, DeviceAllocator& device, const std::string& p2p, int tied_first,
                         int tied_last) {
  std::unique_ptr<MpiCommunicator> pair = grid.pair_comm(tied_first, tied_last, "tied-embedding");
  if (device.device().kind == DeviceKind::Host) {
    tp_ = &grid.comm("tp");
    dp_ = &grid.comm("dp-cp");
    pp_ = &grid.comm("pp");
    cp_ = &grid.comm("cp");
    if (grid.shape().ep > 1) {
      ep_ = &grid.comm("ep");
      ep_backward_ = &grid.comm("ep", 1);
      expert_dp_ = &grid.comm("edp");
    }
    tied_mpi_ = std::move(pair);
    tied_ = tied_mpi_.get();
    summary_ = "mpi";
    return;
  }
  std::string why;
  const bool have_nccl = nccl_available(&why);
  if (p2p == "nccl" && !have_nccl) fail("comm.p2p = \"nccl\": {}", why);
  const bool p2p_nccl = p2p == "nccl" || (p2p == "auto" && have_nccl);
  const int gpu = device.device().index;
  std::vector<std::string> parts;
  // One group's communicator: NCCL when asked and the group has peers, else host-staged MPI.
  auto make = [&](MpiCommunicator& group, bool nccl, bool p2p_group, const std::string& what,
                  std::unique_ptr<Communicator>& own) -> Communicator* {
    if (nccl && group.size() > 1) {
      if (!have_nccl) fail("{} over NCCL on GPUs: {}", what, why);
      check_distinct_gpus(group, device, what, p2p_group);
      own = make_nccl_communicator(dup(group), group.name(), gpu);
      parts.push_back(group.name() + " nccl");
    } else {
      own = std::make_unique<StagedCommunicator>(group, device);
      parts.push_back(group.name() + (group.size() > 1 ? " mpi (host-staged)" : " (1 rank)"));
    }
    return own.get();
  };
  tp_ = make(grid.comm("tp"), true, false, "tensor parallelism", own_tp_);
  // Ranks sharing a GPU (a test's replicas, or context parallelism's ring on one GPU) sum
  // their gradients over host-staged MPI; NCCL needs one GPU per rank.
  dp_ = make(grid.comm("dp-cp"), !shared_gpu(grid.comm("dp-cp"), device), false, "data parallelism", own_dp_);
  pp_ = make(grid.comm("pp"), p2p_nccl, true, "the pipeline", own_pp_);
  pp_nccl_ = p2p_nccl && grid.comm("pp").size() > 1;
  // The ring's sends and receives are posted together on every rank, in either order: MPI's
  // nonblocking pairs take that; NCCL's would need them grouped.
  if (grid.comm("cp").size() > 1) cp_ = make(grid.comm("cp"), false, false, "context parallelism", own_cp_);
  if (grid.shape().ep > 1) {  // the experts' ranks, as dp's: NCCL unless two of them share a GPU
    const bool nccl = !shared_gpu(grid.comm("ep"), device);
    ep_ = make(grid.comm("ep"), nccl, false, "expert parallelism", own_ep_);
    ep_backward_ = make(grid.comm("ep", 1), nccl, false, "expert parallelism", own_ep_backward_);
    ep_nccl_ = nccl;
    expert_dp_ = make(grid.comm("edp"), !shared_gpu(grid.comm("edp"), device), false, "the experts' data parallelism",
                      own_expert_dp_);
  }
  if (pair) {
    tied_mpi_ = std::move(pair);
    tied_ = make(*tied_mpi_, p2p_nccl, true, "the tied embedding", own_tied_);
    tied_nccl_ = p2p_nccl;
  }
  summary_ = fmt::format("{}", fmt::join(parts, ", "));
}

DeviceComms::~DeviceComms() = default;

double DeviceComms::reduction_scratch_peak_bytes() const {
  std::vector<const Communicator*> seen;
  double bytes = 0;
  for (const Communicator* c : {tp_, dp_, pp_, tied_, cp_, ep_, ep_backward_, expert_dp_}) {
    if (!c || std::find(seen.begin(), seen.end(), c) != seen.end()) continue;
    seen.push_back(c);
    bytes += c->reduction_scratch_peak_bytes();
  }
  return bytes;
}

}  // namespace pipetrain
