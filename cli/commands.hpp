// One function per kvcheck subcommand; each reads its flags, calls the part
// that does the work (pipelines/, sweep/, properties/) and returns the
// process exit code.
#pragma once

#include <string>
#include <vector>

#include "cli/args.hpp"
#include "sweep/sweep.hpp"

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

/// Writes a finished sweep the way `kvcheck sweep` does (--json, --csv,
/// --svg, else the table on stdout; the summary on stderr) and returns its
/// exit code; `workers` says what ran it ("2 threads", "3 shards").
int sweep_outputs(const sweep::SweepResult& result, const Args& args, double seconds, const std::string& workers);

}  // namespace kvcheck::cli
