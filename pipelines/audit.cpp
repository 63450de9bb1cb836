#include "pipelines/audit.hpp"

#include <algorithm>
#include <cstdio>

#include "pipelines/replay.hpp"
#include "properties/audit.hpp"
#include "properties/memory_estimate.hpp"
#include "reports/report_text.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"

namespace kvcheck::pipelines {

int run_audit(const AuditRequest& request) {
  properties::AuditOptions options;
  options.precision_bits = request.precision_bits;
  const auto files = scenarios::collect_trace_files(request.files_or_dirs);
  if (files.empty()) throw Error(ErrorId::kUsage, "TRACE", "no *.jsonl trace files found");
  // Load and build everything first: a bad file stops the audit before any report is written.
  std::vector<scenarios::TraceRun> runs;
  for (const auto& f : files) {
    for (auto& run : scenarios::load_trace_file(f)) runs.push_back(std::move(run));
  }
  // The reads the records list, before any is expanded (a block table of a
  // few bytes can ask for 2^26 reads): the user's bound, then their memory.
  properties::RunOptions estimated;
  estimated.backend = "trace";
  estimated.precision_bits = options.precision_bits;
  estimated.record_reads = options.record_reads;
  properties::require_work(properties::estimate_audit_work({}, runs), "the audit", request.work_limit);
  properties::require_memory(properties::estimate_audit({}, runs, estimated), request.memory_limit_bytes,
                             request.limit_source);
  std::vector<std::string> notes;
  std::vector<scenarios::Scenario> built;
  for (const auto& run : runs) {
    const properties::TraceScenario ts = properties::trace_scenario(run);
    built.push_back(ts.scenario);
    if (!ts.judge_outputs) {
      notes.push_back("note: " + run.header.name + " (" + (run.source.empty() ? "trace" : run.source) +
                      " line " + std::to_string(run.header_line) +
                      "): slots judged, outputs not: " + ts.outputs_note + "\n");
    }
  }

  withdraw_report_files(request.files);  // no earlier verdict stands while this one is made
  // Refused before anything is judged when the runs would not fit, or take
  // longer than the user allows; long work is announced, then shown.
  const properties::WorkEstimate work = properties::estimate_audit_work(built, runs);
  const properties::MemoryEstimate memory = properties::estimate_audit(built, runs, estimated);
  properties::require_work(work, "the audit", request.work_limit);
  properties::require_memory(memory, request.memory_limit_bytes, request.limit_source);
  options.on_query_judged = long_work_meter("audit", work.reads, std::max(work.all_layer_reads, work.reads),
                                            memory, request.progress, stderr);
  built.clear();

  reports::Report report;
  report.context = report_context(request.command, 0, "trace", "none", options.precision_bits);
  for (auto& run : properties::audit_trace(runs, options)) report.runs.push_back(std::move(run));
  if (options.on_query_judged && request.progress) {
    const auto total = static_cast<std::int64_t>(std::max({work.all_layer_reads, work.reads, 1.0}));
    request.progress(total, total);  // ends the progress line
  }
  const std::string text = reports::report_text(report);
  std::fputs(text.c_str(), stdout);
  for (const std::string& note : notes) std::fputs(note.c_str(), stdout);
  return write_report_files(report, text, request.files);
}

}  // namespace kvcheck::pipelines
