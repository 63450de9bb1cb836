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

int run_demo(const DemoOptions& demo) {
  const fs::path& out = demo.out_dir;
  const std::string& bundled = demo.scenarios_dir;
  // The real significand of the default reference, not the nominal 113 that
  // names --precision's default: Boost gives mpfr_float_backend<34>
  // 34 * 1000 / 301 + 2 = 114 bits (std::numeric_limits<Real>::digits, what
  // report.json's context and runs record as precision_bits; the 113 is
  // context.precision_requested).
  std::printf("== 1. SPEC §6 reproduced by the reference model (%d-bit MPFR) ==\n",
              model::real_bits<model::Real>());
  bool spec_ok = true;
  std::fputs(spec_table(&spec_ok).c_str(), stdout);

  std::printf("\n== 2. Bundled scenarios replayed on the CPU backend (%s) ==\n", bundled.c_str());
  properties::CheckOptions options;
  options.cases = demo.cases;
  options.seed = demo.seed;
  options.progress = demo.progress;
  reports::Report report;
  report.context =
      report_context(demo.command, options.seed, "cpu", impl::Fault::kNone, options.run.precision_bits);
  for (const auto& f : scenarios::collect_scenario_files({bundled})) {
    report.runs.push_back(properties::run_scenario(scenarios::load_scenario_file(f), options.run));
  }
  std::fputs(reports::report_text(report).c_str(), stdout);

  std::printf("\n== 3. Randomized check of the CPU backend ==\n");
  const int check_code = run_check_into(options, out, report);

  std::printf("\n== 4. Minimum safe ring sizes by simulation (kvcheck sweep) ==\n");
  sweep::SweepOptions sweep_options;
  sweep_options.counterexamples = sweep::CounterexampleMode::kNone;
  const sweep::SweepResult swept = sweep::run_sweep(demo_grid(), sweep_options);
  std::fputs(sweep::sweep_table(swept).c_str(), stdout);

  // An engine's cache in another process, live over the exec protocol: the
  // bundled paged adapter, correct and then with a bug engines have shipped.
  const std::string paged = "exec:python3 " + demo.source_dir + "/adapters/paged_cache.py";
  std::printf("\n== 5. An engine in another process: %s ==\n", paged.c_str());
  properties::CheckOptions live = options;
  live.run.backend = paged;
  reports::Report scratch;
  const int live_code = run_check_into(live, out / "exec", scratch);
  std::printf("\n-- the same adapter with --bug free-early (a block freed one step too early) --\n");
  live.run.backend = paged + " --bug free-early";
  const int bug_code = run_check_into(live, out / "exec", scratch);

  const fs::path trace = fs::path(demo.source_dir) / "traces" / "paged-engine-early-free.jsonl";
  std::printf("\n== 6. A recorded trace audited (kvcheck audit %s) ==\n", trace.string().c_str());
  reports::Report audited;
  properties::AuditOptions audit_options;
  audited.context =
      report_context(demo.command, 0, "trace", impl::Fault::kNone, audit_options.precision_bits);
  audited.runs = properties::audit_trace(scenarios::load_trace_file(trace), audit_options);
  std::fputs(reports::report_text(audited).c_str(), stdout);

  // The live runs' counterexample (the bug's) goes to out/exec.
  if (write_set_keeping_verdict(scratch.attachments, 0) != 0) return 2;
  if (write_reports(report, out, 0) != 0) return 2;
  std::printf("\nHTML report: %s/report.html (also report.json, report.txt, junit.xml)\n",
              out.string().c_str());
  // The bug switch and the early-free trace are meant to fail: the demo
  // fails if they do not (kvcheck would have missed a real bug).
  const bool bug_caught = bug_code == 1 && !audited.passed();
  return spec_ok && report.passed() && check_code == 0 && swept.spec_disagreements == 0 && live_code == 0 &&
                 bug_caught
             ? 0
             : 1;
}

}  // namespace kvcheck::pipelines
