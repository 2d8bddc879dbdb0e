// The `pipetrain` subcommands. Each adds itself to the CLI11 app and returns a
// callback that runs it after parsing (exit status returned).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace pipetrain {

using CommandRunner = std::function<int()>;

// True on rank 0 of MPI_COMM_WORLD (and when MPI is not running).
bool is_world_rank0();
// Makes `sub`, once parsed, set `runner` to run `work` on rank 0 only (the file tools:
// data, ckpt; under mpirun the other ranks have nothing to do).
void run_on_rank0(CLI::App* sub, CommandRunner& runner, std::function<void()> work);

// `pipetrain train CONFIG [--set k=v]... [--metrics FILE]`
void add_train_command(CLI::App& app, CommandRunner& runner);
// `pipetrain data text|llmc ... -o OUT.h5`
void add_data_command(CLI::App& app, CommandRunner& runner);
// `pipetrain schedule NAME|--file F --ranks R [--stages S] --microbatches M ...`
void add_schedule_command(CLI::App& app, CommandRunner& runner);
// `pipetrain ckpt inspect|verify|import-llmc|export-llmc ...`
void add_ckpt_command(CLI::App& app, CommandRunner& runner);
void add_report_command(CLI::App& app, CommandRunner& runner);
// `pipetrain generate CKPT [--prompt TEXT] [--tokens N] [--greedy] ...`
void add_generate_command(CLI::App& app, CommandRunner& runner);

// `pipetrain check CONFIG [--set k=v]... [--ranks N] [--cluster CLUSTER.toml] [--plan auto]`
void add_check_command(CLI::App& app, CommandRunner& runner);

// `pipetrain plan CONFIG --cluster CLUSTER.toml ...` and `plan CONFIG --calibrate -o CLUSTER.toml`
void add_plan_command(CLI::App& app, CommandRunner& runner);

// `pipetrain --version` text: version, git revision, compiler, backends, MPI, HDF5.
std::string version_text();

}  // namespace pipetrain
