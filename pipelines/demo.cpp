#include "pipelines/demo.hpp"

#include <cstdio>

#include "model/real.hpp"
#include "pipelines/catalog.hpp"
#include "pipelines/check.hpp"
#include "properties/audit.hpp"
#include "properties/check.hpp"
#include "properties/runner.hpp"
#include "reports/report.hpp"
#include "reports/report_text.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/trace_json.hpp"
#include "sweep/sweep_output.hpp"

namespace kvcheck::pipelines {

namespace fs = std::filesystem;

sweep::SweepGrid demo_grid() {
  sweep::SweepGrid grid;
  grid.windows = {128};
  grid.drafts = {0, 1, 5};
  grid.chunks = {1, 64};
  grid.orders = {sweep::SweepOrder::kStoreThenLoad, sweep::SweepOrder::kLoadThenStore};
  return grid;
}

namespace {

/// Prints a part's heading as the report names it.
void print_title(const std::string& title) { std::printf("== %s ==\n", title.c_str()); }

/// The text of a part with runs or a check, as report.txt gives it: its own
/// report (its command, its runs, its check, its verdict line).
std::string part_text(const reports::ReportPart& part) { return reports::report_text(reports::part_report(part)); }

/// A check the demo runs into `part`: its terminal summary is printed as it
/// runs; the counterexample, if any, goes to `attachments`.
void check_part(const properties::CheckOptions& options, const fs::path& out, reports::ReportPart* part,
                std::vector<reports::OutputFile>* attachments) {
  reports::Report checked;
  checked.context = part->context;
  const int code = run_check_into(options, out, checked);
  part->runs = checked.runs;
  part->check = checked.check;
  part->failed = code != 0;
  part->text = part_text(*part);
  for (auto& a : checked.attachments) attachments->push_back(std::move(a));
}

}  // namespace

int run_demo(const DemoOptions& demo) {
  const fs::path& out = demo.out_dir;
  const std::string& bundled = demo.scenarios_dir;
  properties::CheckOptions options;
  options.cases = demo.cases;
  options.seed = demo.seed;
  options.progress = demo.progress;
  // The demo's report: one part per section printed here, each with the
  // command that replays it and whether it showed what it is meant to (the
  // planted faults of parts 5 and 6 must be caught). Text, HTML, JSON, JUnit,
  // the last line and the exit code all come from it.
  reports::Report report;
  report.context =
      report_context(demo.command, options.seed, "cpu", "none", options.run.precision_bits);
  const std::string counts = " --cases " + std::to_string(options.cases) + " --seed " + std::to_string(options.seed);
  const auto context = [&](const std::string& command, const std::string& backend) {
    return report_context(command, options.seed, backend, "none", options.run.precision_bits);
  };

  // The real significand of the default reference, not the nominal 113 that
  // names --precision's default: Boost gives mpfr_float_backend<34>
  // 34 * 1000 / 301 + 2 = 114 bits (std::numeric_limits<Real>::digits, what
  // report.json's context and runs record as precision_bits; the 113 is
  // context.precision_requested).
  {
    reports::ReportPart part;
    part.title = "1. Golden values reproduced by the reference model (" +
                 std::to_string(model::real_bits<model::Real>()) + "-bit MPFR)";
    part.context.command = "kvcheck spec";
    print_title(part.title);
    bool spec_ok = true;
    part.text = spec_table(&spec_ok);
    part.failed = !spec_ok;
    std::fputs(part.text.c_str(), stdout);
    std::fputs(reports::part_verdict_line(part).c_str(), stdout);
    report.parts.push_back(std::move(part));
  }
  {
    reports::ReportPart part;
    part.title = "2. Bundled scenarios replayed on the CPU backend (" + bundled + ")";
    part.context = context("kvcheck replay " + properties::shell_quote(bundled), "cpu");
    std::printf("\n");
    print_title(part.title);
    for (const auto& f : scenarios::collect_scenario_files({bundled})) {
      part.runs.push_back(properties::run_scenario(scenarios::load_scenario_file(f), options.run));
    }
    part.failed = !reports::part_report(part).passed();
    part.text = part_text(part);
    std::fputs(part.text.c_str(), stdout);
    std::fputs(reports::part_verdict_line(part).c_str(), stdout);
    report.parts.push_back(std::move(part));
  }
  {
    reports::ReportPart part;
    part.title = "3. Randomized check of the CPU backend";
    part.context = context("kvcheck check" + counts, "cpu");
    std::printf("\n");
    print_title(part.title);
    check_part(options, out, &part, &report.attachments);
    std::fputs(reports::part_verdict_line(part).c_str(), stdout);
    report.parts.push_back(std::move(part));
  }
  {
    reports::ReportPart part;
    part.title = "4. Minimum safe ring sizes by simulation (kvcheck sweep)";
    std::printf("\n");
    print_title(part.title);
    sweep::SweepOptions sweep_options;
    sweep_options.counterexamples = sweep::CounterexampleMode::kNone;
    const sweep::SweepResult swept = sweep::run_sweep(demo_grid(), sweep_options);
    // No replay command: the sweep flags take ranges, not the grid's drafts {0, 1, 5}.
    part.text = sweep::sweep_table(swept);
    part.failed = swept.spec_disagreements != 0;
    std::fputs(part.text.c_str(), stdout);
    std::fputs(reports::part_verdict_line(part).c_str(), stdout);
    report.parts.push_back(std::move(part));
  }

  // An engine's cache in another process, live over the exec protocol: the
  // bundled paged adapter, correct and then with a bug engines have shipped
  // (planted: it must be caught). Its counterexample goes to out/exec.
  const std::string paged = "exec:python3 " + demo.source_dir + "/adapters/paged_cache.py";
  std::vector<reports::OutputFile> exec_files;
  {
    reports::ReportPart part;
    part.title = "5. An engine in another process: " + paged;
    properties::CheckOptions live = options;
    live.run.backend = paged;
    part.context = context("kvcheck check --impl " + properties::shell_quote(paged) + counts, paged);
    std::printf("\n");
    print_title(part.title);
    check_part(live, out / "exec", &part, &exec_files);
    std::fputs(reports::part_verdict_line(part).c_str(), stdout);
    report.parts.push_back(std::move(part));
  }
  {
    reports::ReportPart part;
    part.title = "5b. The same adapter with --bug free-early (a block freed one step too early)";
    part.planted_fault = true;
    properties::CheckOptions live = options;
    live.run.backend = paged + " --bug free-early";
    part.context =
        context("kvcheck check --impl " + properties::shell_quote(live.run.backend) + counts, live.run.backend);
    std::printf("\n");
    print_title(part.title);
    check_part(live, out / "exec", &part, &exec_files);
    std::fputs(reports::part_verdict_line(part).c_str(), stdout);
    report.parts.push_back(std::move(part));
  }
  {
    const fs::path trace = fs::path(demo.source_dir) / "traces" / "paged-engine-early-free.jsonl";
    reports::ReportPart part;
    part.title = "6. A recorded trace audited (kvcheck audit " + trace.string() + ")";
    part.planted_fault = true;
    properties::AuditOptions audit_options;
    // The command that replays what this part ran: the audit of that trace.
    part.context = report_context("kvcheck audit " + properties::shell_quote(trace.string()), 0, "trace",
                                  "none", audit_options.precision_bits);
    std::printf("\n");
    print_title(part.title);
    part.runs = properties::audit_trace(scenarios::load_trace_file(trace), audit_options);
    part.failed = !reports::part_report(part).passed();
    part.text = part_text(part);
    std::fputs(part.text.c_str(), stdout);
    std::fputs(reports::part_verdict_line(part).c_str(), stdout);
    report.parts.push_back(std::move(part));
  }

  const int code = report.passed() ? 0 : 1;
  // The live runs' counterexample (the bug's) goes to out/exec.
  if (write_set_keeping_verdict(exec_files, code) != code) return 2;
  if (write_reports(report, out, code) != code) return 2;
  std::printf("\nHTML report: %s/report.html (also report.json, report.txt, junit.xml)\n",
              out.string().c_str());
  // The last line is report.txt's: what the demo showed, and its exit code.
  std::printf("\n%s", reports::verdict_line(report).c_str());
  return code;
}

}  // namespace kvcheck::pipelines
