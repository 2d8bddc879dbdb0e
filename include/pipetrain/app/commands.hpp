// The `pipetrain` subcommands. Each adds itself to the CLI11 app and returns a
// callback that runs it after parsing (exit status returned).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace pipetrain {

using CommandRunner = std::function<int()>;

// `pipetrain train CONFIG [--set k=v]... [--metrics FILE]`
void add_train_command(CLI::App& app, CommandRunner& runner);
// `pipetrain data text|llmc ... -o OUT.h5`
void add_data_command(CLI::App& app, CommandRunner& runner);
// `pipetrain schedule NAME|--file F --ranks R [--stages S] --microbatches M ...`
void add_schedule_command(CLI::App& app, CommandRunner& runner);
// `pipetrain ckpt inspect|verify|import-llmc|export-llmc ...`
void add_ckpt_command(CLI::App& app, CommandRunner& runner);
void add_report_command(CLI::App& app, CommandRunner& runner);

// `pipetrain --version` text: version, git revision, compiler, backends, MPI, HDF5.
std::string version_text();

}  // namespace pipetrain
