#include "pipelines/audit.hpp"

#include <cstdio>

#include "impl/kv_cache.hpp"
#include "properties/audit.hpp"
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
  std::vector<std::string> notes;
  for (const auto& run : runs) {
    const properties::TraceScenario ts = properties::trace_scenario(run);
    if (!ts.judge_outputs) {
      notes.push_back("note: " + run.header.name + " (" + (run.source.empty() ? "trace" : run.source) +
                      " line " + std::to_string(run.header_line) +
                      "): slots judged, outputs not: " + ts.outputs_note + "\n");
    }
  }

  reports::Report report;
  report.context = report_context(request.command, 0, "trace", impl::Fault::kNone, options.precision_bits);
  for (auto& run : properties::audit_trace(runs, options)) report.runs.push_back(std::move(run));
  const std::string text = reports::report_text(report);
  std::fputs(text.c_str(), stdout);
  for (const std::string& note : notes) std::fputs(note.c_str(), stdout);
  return write_report_files(report, text, request.files);
}

}  // namespace kvcheck::pipelines
