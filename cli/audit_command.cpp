// kvcheck audit TRACE... : judges recorded traces (scenarios/trace.hpp) of an
// engine that cannot be driven live, or recordings kvcheck made itself
// (--record), with the same runner and reports as a live run.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "pipelines/check.hpp"
#include "properties/audit.hpp"
#include "reports/report.hpp"
#include "reports/report_html.hpp"
#include "reports/report_json.hpp"
#include "reports/report_junit.hpp"
#include "reports/report_text.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"

namespace kvcheck::cli {

int command_audit(int argc, char** argv) {
  Args args(argc, argv, 2, {"--report", "--junit", "--html", "--text", "--precision"}, {});
  if (args.positional().empty()) throw Error(ErrorId::kUsage, "TRACE", "audit needs trace files (*.jsonl) or directories");
  const auto bits = args.integer("--precision", 113, 1, 1024);
  if (bits != 53 && bits != 113 && bits != 169) {
    throw Error(ErrorId::kUsage, "--precision", "must be 53, 113 (default) or 169 bits");
  }
  properties::AuditOptions options;
  options.precision_bits = static_cast<int>(bits);
  const auto files = scenarios::collect_trace_files(args.positional());
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
      notes.push_back("note: " + run.header.name + " (" + (run.source.empty() ? "trace" : run.source) + " line " +
                      std::to_string(run.header_line) + "): slots judged, outputs not: " + ts.outputs_note + "\n");
    }
  }

  reports::Report report;
  report.context.backend = "trace";
  report.context.fault = "none";
  report.context.precision_bits = options.precision_bits;
  report.context.command = "kvcheck";
  for (int i = 1; i < argc; ++i) report.context.command += std::string(" ") + argv[i];
  for (auto& run : properties::audit_trace(runs, options)) report.runs.push_back(std::move(run));
  const std::string text = reports::report_text(report);
  std::fputs(text.c_str(), stdout);
  for (const std::string& note : notes) std::fputs(note.c_str(), stdout);
  std::vector<reports::OutputFile> outputs;
  if (const auto f = args.get("--text")) outputs.push_back({*f, text});
  if (const auto f = args.get("--report")) outputs.push_back({*f, reports::report_json_text(report)});
  if (const auto f = args.get("--junit")) outputs.push_back({*f, reports::report_junit(report)});
  if (const auto f = args.get("--html")) outputs.push_back({*f, reports::report_html(report)});
  return pipelines::write_set_keeping_verdict(outputs, report.passed() ? 0 : 1);
}

}  // namespace kvcheck::cli
