// `pipetrain plan --calibrate`: measures the machine the job runs on and describes it as
// a cluster file — the best product rate, each kind of layer's rate at the config's
// microbatch shape, AdamW's memory bandwidth, point-to-point and all-reduce costs between
// the ranks it was started on — so that the planner predicts this machine's steps.
// Exports: calibrate_cluster.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/plan/cluster.hpp"

namespace pipetrain {

// Collective over `world` (every rank measures at once, as they will train at once; the
// rates are their mean). `log` receives one line per measurement on rank 0.
ClusterSpec calibrate_cluster(const Config& cfg, Backend& backend, MPI_Comm world,
                              const std::function<void(const std::string&)>& log = {});

}  // namespace pipetrain
