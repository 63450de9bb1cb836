// kvcheck audit TRACE... : flags in, pipelines/audit.hpp judges the
// recorded traces (scenarios/trace.hpp) with the same runner and reports as
// a live run.
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/usage.hpp"
#include "pipelines/audit.hpp"
#include "reports/output_set.hpp"
#include "support/error.hpp"

namespace kvcheck::cli {

int command_audit(int argc, char** argv) {
  Args args = command_args(argc, argv, "audit");
  if (args.positional().empty())
    throw Error(ErrorId::kUsage, "TRACE", "audit needs trace files (*.jsonl) or directories");
  pipelines::AuditRequest request;
  request.files_or_dirs = args.positional();
  request.precision_bits = precision_flag(args);
  // The whole command line: an audit has no flag that leaves its result alone.
  request.command = "kvcheck";
  for (int i = 1; i < argc; ++i) request.command += std::string(" ") + argv[i];
  if (const auto f = args.get("--text")) request.files.text = *f;
  if (const auto f = args.get("--report")) request.files.json = *f;
  if (const auto f = args.get("--junit")) request.files.junit = *f;
  if (const auto f = args.get("--html")) request.files.html = *f;
  {
    // One file per output, each in a directory that takes it, before any work.
    const std::vector<reports::NamedOutput> named = pipelines::named_outputs(request.files);
    reports::require_distinct_outputs(named);
    for (const auto& o : named) reports::require_writable_output(o);
  }
  request.memory_limit_bytes = memory_limit_flag(args, &request.limit_source);
  request.work_limit = work_limit_flag(args);
  request.progress = progress_bar("audit");
  return pipelines::run_audit(request);
}

}  // namespace kvcheck::cli
