// One function per kvcheck subcommand; each returns the process exit code.
#pragma once

#include <string>
#include <vector>

#include "cli/args.hpp"
#include "reports/output_set.hpp"
#include "reports/sweep/sweep.hpp"

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

/// Writes `files` as one set (reports/output_set.hpp) and returns `code`;
/// when writing fails, prints the error and that the verdict stands, and
/// returns 1 for a failed property, else 2. Used by every command that
/// writes reports.
int write_set_keeping_verdict(const std::vector<reports::OutputFile>& files, int code);

/// Writes a finished sweep the way `kvcheck sweep` does (--json, --csv,
/// --svg, else the table on stdout; the summary on stderr) and returns its
/// exit code; `workers` says what ran it ("2 threads", "3 shards").
int sweep_outputs(const sweep::SweepResult& result, const Args& args, double seconds, const std::string& workers);

}  // namespace kvcheck::cli
