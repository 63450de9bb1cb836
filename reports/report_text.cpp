// Text report writer.
#include "reports/report_text.hpp"

#include <algorithm>
#include <cmath>

namespace kvcheck::reports {
namespace {

// Queries listed per failing step before "… (N more queries)"; keeps a failing
// run's explanation under ~25 lines.
constexpr std::size_t kQueriesShown = 8;
// Positions listed per query before truncation.
constexpr std::size_t kPositionsShown = 12;

std::string tag_list(const std::vector<properties::ReadTag>& tags, std::size_t limit) {
  std::string out = "[";
  const std::size_t shown = std::min(tags.size(), limit);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i != 0) out += ',';
    const auto& t = tags[i];
    out += "slot " + std::to_string(t.slot) + "=";
    out += t.request < 0 ? std::string("empty")
                         : "(r" + std::to_string(t.request) + ",p" + std::to_string(t.position) + ")";
  }
  if (shown < tags.size()) out += ",\u2026 (" + std::to_string(tags.size() - shown) + " more)";
  return out + "]";
}

}  // namespace

std::string run_summary_line(const properties::RunObservation& run) {
  std::string line = run.skipped ? "SKIP  " : (run.passed ? "PASS  " : "FAIL  ");
  line += run.scenario_name;
  if (run.skipped) return line + "  (" + run.skip_reason + ")";
  line += "  S=" + std::to_string(run.ring_rows) + " W=" + std::to_string(run.window_keys) + "(" +
          run.window_convention + ") " + run.format;
  line += "  steps=" + std::to_string(run.steps.size()) + " queries=" + std::to_string(run.queries);
  line += " lost=" + std::to_string(run.lost_rows) + " extra=" + std::to_string(run.extra_reads);
  line += " collisions=" + std::to_string(run.collisions);
  line += " output_failures=" + std::to_string(run.output_failures);
  line += " max_eps=" + format_double(run.max_eps_units);
  if (run.queries_not_output_checked > 0)
    line += " not_output_checked=" + std::to_string(run.queries_not_output_checked);
  if (run.observed != "slots+outputs") line += " observed=" + run.observed;
  if (run.probes > 0) line += " probes=" + std::to_string(run.probes);
  if (run.mpfr_queries > 0) line += " mpfr_queries=" + std::to_string(run.mpfr_queries);
  return line;
}

std::string run_explanation(const Report& report, const properties::RunObservation& run) {
  std::string out;
  out += "FAIL " + run.scenario_name + " (backend " + run.backend + ", fault " + run.fault + ")\n";
  if (!run.first_failure.empty()) out += "  first failure: " + run.first_failure + "\n";

  const std::int64_t index = first_failing_step(run);
  if (index >= 0) {
    const auto& s = run.steps[static_cast<std::size_t>(index)];
    out += "  step " + std::to_string(s.step) + " (" + s.kind + (s.order.empty() ? "" : " " + s.order) +
           ", layer " + std::to_string(s.layer) + ", request " + std::to_string(s.request) + ", state " +
           std::to_string(s.state) + ", first position " + std::to_string(s.first_position) + ", " +
           std::to_string(s.queries.size()) + " queries)\n";
    out += "  overwritten rows per query: " + overwritten_counts(s) + "\n";

    std::size_t listed = 0;
    std::size_t failing = 0;
    double max_eps = 0;
    std::int64_t max_eps_position = -1;
    const properties::QueryObservation* worst = nullptr;
    for (const auto& q : s.queries) {
      if (worst == nullptr || q.eps_units > max_eps || std::isnan(q.eps_units)) {
        worst = &q;
        max_eps = q.eps_units;
        max_eps_position = q.position;
      }
      if (!query_failed(q)) continue;
      ++failing;
      if (listed == kQueriesShown) continue;
      ++listed;
      std::string line = "    query " + std::to_string(q.position) + " visible " +
                         std::to_string(q.visible_first) + ".." + std::to_string(q.position) + ":";
      if (!q.overwritten.empty()) line += " overwritten " + int_list(q.overwritten, kPositionsShown);
      if (!q.missing.empty()) line += " missing " + int_list(q.missing, kPositionsShown);
      if (!q.extra.empty()) line += " extra " + tag_list(q.extra, 4);
      if (!q.output_ok) line += " output " + format_double(q.eps_units) + " eps > tolerance";
      out += line + "\n";
    }
    if (failing > listed) out += "    \u2026 (" + std::to_string(failing - listed) + " more queries)\n";

    const auto& c = s.collisions;
    if (c.total() != 0) {
      out += "  collisions: " + std::to_string(c.same_step) + " same-step, " +
             std::to_string(c.outside_block) + " outside block, " + std::to_string(c.replaced_needed) +
             " replaced a row still needed\n";
    }
    if (worst != nullptr) {
      out += "  max output error in step: " + format_double(max_eps) + " eps (abs " +
             format_double(worst->abs_diff) + ", tolerance " + format_double(worst->tolerance) +
             ", quantization " + format_double(worst->quant_abs_diff) + ") at query " +
             std::to_string(max_eps_position) + "\n";
    }
    if (!s.error.empty()) out += "  refusal: " + s.error + "\n";
    if (s.expectation_failed) out += "  expectation failed: " + s.expectation_detail + "\n";
  }
  out += "  max output error in run: " + format_double(run.max_eps_units) + " eps (abs " +
         format_double(run.max_abs_diff) + ", with quantization " + format_double(run.max_quant_abs_diff) +
         ")\n";
  const std::string replay = replay_command(report);
  if (!replay.empty()) out += "  replay: " + replay + "\n";
  out += "  seed: " + std::to_string(report.check ? report.check->failing_case_seed : report.context.seed) +
         "\n";
  return out;
}

std::string report_text(const Report& report) {
  const auto& ctx = report.context;
  std::string out = "kvcheck " + ctx.tool_version + "  backend " + ctx.backend + ", fault " + ctx.fault +
                    ", seed " + std::to_string(ctx.seed) + ", reference " +
                    std::to_string(ctx.precision_bits) + " bits\n";
  for (const auto& run : report.runs) out += run_summary_line(run) + "\n";
  for (const auto& run : report.runs) {
    if (!run.passed) out += "\n" + run_explanation(report, run);
  }
  if (report.check) {
    const auto& c = *report.check;
    out += "\ncheck: " + std::string(c.passed() ? "PASS" : "FAIL") + ", " + check_counts_text(c) + "\n";
    for (const auto& k : c.coverage) {
      out += "  coverage " + k.name + ": " + std::to_string(k.count) + " (minimum " +
             std::to_string(k.minimum) + ")" + (k.met() ? "" : "  BELOW MINIMUM") + "\n";
    }
    if (!c.counterexample_file.empty()) out += "  counterexample: " + c.counterexample_file + "\n";
    if (c.failures != 0) out += "  failing case seed: " + std::to_string(c.failing_case_seed) + "\n";
    if (c.depends_on_earlier) {
      out += "  " + earlier_cases_text(*c.depends_on_earlier, c.failing_case_seed) + "\n";
      if (!c.depends_on_earlier->reproduced)
        out += "  first failure in its process: " + c.depends_on_earlier->first_failure_there + "\n";
    }
    if (!c.replay_command.empty() && !c.passed()) out += "  replay: " + c.replay_command + "\n";
  }
  // The verdict line names what ran: a PASS over runs that were all refused
  // or skipped cannot be printed (Report::passed). A check's line is its
  // cases' (its runs are the counterexample, if any).
  out += "\n" + std::string(report.passed() ? "PASS" : "FAIL") + ": " +
         (report.check ? check_counts_text(*report.check) : run_counts_text(run_counts(report))) + "\n";
  return out;
}

}  // namespace kvcheck::reports
