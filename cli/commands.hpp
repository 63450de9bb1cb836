// One function per kvcheck subcommand; each reads its flags, calls one
// pipeline (pipelines/) that does the work and returns the
// process exit code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cli/args.hpp"
#include "pipelines/sweep.hpp"
#include "properties/check.hpp"
#include "properties/memory_estimate.hpp"

namespace kvcheck::cli {

int command_demo(int argc, char** argv);
int command_spec(int argc, char** argv);
int command_check(int argc, char** argv);
int command_replay(int argc, char** argv);
int command_trace(int argc, char** argv);
int command_sweep(int argc, char** argv);
int command_faults(int argc, char** argv);
int command_audit(int argc, char** argv);
int command_merge(int argc, char** argv);

/// --json, --csv and --svg of `sweep` and a sweep's `merge`; refuses an
/// empty name and more than one '-' (stdout).
pipelines::SweepOutputFiles sweep_output_flags(const Args& args);

/// The sizes of `grid` its sweep's memory grows with (states and threads
/// left at 1).
properties::SweepSize sweep_size(const sweep::SweepGrid& grid);

/// The options of check and replay (properties/option_table.hpp) read from
/// `args`, every row the table lists, each as `kvcheck check` reads it;
/// an option `args` does not hold keeps its default. With `probe_backend`
/// a cpu or cuda --impl must be usable here (a missing device is kDevice).
properties::CheckOptions read_check_options(const Args& args, bool probe_backend);

/// The memory a run may use: --memory-limit, else what the machine has free;
/// `*source` says which (for the refusal's message).
std::int64_t memory_limit_flag(const Args& args, std::string* source);

/// --work-limit ROWS: the most rows a command's work may read or simulate;
/// none when not given (nothing is refused for its work alone).
std::optional<std::int64_t> work_limit_flag(const Args& args);

}  // namespace kvcheck::cli
