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
    out += t.request < 0
               ? std::string("empty")
               : "(r" + std::to_string(t.request) + ",p" + std::to_string(t.position) +
                     (t.origin_request >= 0 ? " of r" + std::to_string(t.origin_request) : "") + ")";
  }
  if (shown < tags.size()) out += ",\u2026 (" + std::to_string(tags.size() - shown) + " more)";
  return out + "]";
}

// A paged run's failing step: its blocks so far, the request's block table
// and the life of the block that held the first row the focus query lost.
std::string paged_explanation(const properties::RunObservation& run, std::int64_t index) {
  const PagedView view = paged_view(run, index);
  const auto& s = run.steps[static_cast<std::size_t>(index)];
  std::string out = "  blocks of layer " + std::to_string(view.layer) + " through step " +
                    std::to_string(view.through_step) + " (B=" + std::to_string(view.block_size) +
                    "): " + paged_counts_text(view) + "\n";
  for (const auto& table : view.tables) {
    if (table.request == s.request)
      out += "  block table of request " + std::to_string(table.request) + ": " + block_table_text(table) + "\n";
  }
  const std::int64_t focus = focus_query(s);
  if (focus < 0) return out;
  const auto& q = s.queries[static_cast<std::size_t>(focus)];
  const std::int64_t lost = !q.overwritten.empty() ? q.overwritten.front()
                            : !q.missing.empty()   ? q.missing.front()
                                                   : -1;
  const BlockTenancy* t = lost >= 0 ? tenancy_of(view, run, index, s.request, lost) : nullptr;
  if (t != nullptr) out += "  position " + std::to_string(lost) + " lost: " + tenancy_text(*t) + "\n";
  return out;
}

}  // namespace

std::string run_summary_line(const properties::RunObservation& run) {
  std::string line = run.skipped ? "SKIP  " : (run.passed ? "PASS  " : "FAIL  ");
  line += run.scenario_name;
  if (run.skipped) return line + "  (" + run.skip_reason + ")";
  line += "  S=" + std::to_string(run.ring_rows) + " W=" + window_text(run) + " " + run.format;
  if (!run.output_format.empty()) line += " out=" + run.output_format;
  line += "  steps=" + std::to_string(steps_observed(run)) + " queries=" + std::to_string(run.queries);
  line += " lost=" + std::to_string(run.lost_rows) + " extra=" + std::to_string(run.extra_reads);
  line += " collisions=" + std::to_string(run.collisions);
  line += " output_failures=" + std::to_string(run.output_failures);
  line += " max_eps=" + format_double(run.max_eps_units);
  if (run.queries_not_output_checked > 0)
    line += " not_output_checked=" + std::to_string(run.queries_not_output_checked);
  if (run.observed != "slots+outputs") line += " observed=" + run.observed;
  if (run.probes > 0) line += " probes=" + std::to_string(run.probes);
  if (run.mpfr_queries > 0) line += " mpfr_queries=" + std::to_string(run.mpfr_queries);
  if (run.freed_visible > 0) line += " freed_visible=" + std::to_string(run.freed_visible);
  if (run.steps_over_bound > 0) line += " over_bound=" + std::to_string(run.steps_over_bound);
  if (run.late_frees > 0) line += " late_frees=" + std::to_string(run.late_frees);
  if (run.block_size > 0)
    line += " block_size=" + std::to_string(run.block_size) + " pool_blocks=" + std::to_string(run.pool_blocks);
  return line;
}

std::string run_explanation(const Report& report, const properties::RunObservation& run) {
  std::string out;
  out += "FAIL " + run.scenario_name + " (backend " + run.backend + ", fault " + run.fault + ")\n";
  if (!run.first_failure.empty()) out += "  first failure: " + run.first_failure + "\n";
  const bool exact_rows = format_stores_exact_rows(run.format);

  const std::int64_t index = first_failing_step(run);
  if (index >= 0) {
    const auto& s = run.steps[static_cast<std::size_t>(index)];
    out += "  step " + std::to_string(s.step) + " (" + s.kind + (s.order.empty() ? "" : " " + s.order) +
           ", layer " + std::to_string(s.layer) + ", request " + std::to_string(s.request) + ", state " +
           std::to_string(s.state) + ", first position " + std::to_string(s.first_position) + ", " +
           std::to_string(s.queries.size()) + " queries)\n";
    // The shared prefixes begun so far: where a request's first rows came from.
    for (const std::string& line : prefix_lines(run, s.step)) out += "  " + line + "\n";
    out += "  overwritten rows per query: " + overwritten_counts(s) + "\n";

    // The step's counts (StepCounts), as every writer gives them.
    const StepCounts counts = step_counts(s);
    std::size_t listed = 0;
    for (const auto& q : s.queries) {
      if (!query_failed(q)) continue;
      if (listed == kQueriesShown) break;
      ++listed;
      std::string line = "    query " + std::to_string(q.position) + " visible " +
                         std::to_string(q.visible_first) + ".." + std::to_string(q.position) + ":";
      if (!q.overwritten.empty()) line += " overwritten " + int_list(q.overwritten, kPositionsShown);
      if (!q.missing.empty()) line += " missing " + int_list(q.missing, kPositionsShown);
      if (!q.extra.empty()) line += " extra " + tag_list(q.extra, 4);
      if (q.outputs_off_format > 0) {
        line += " " + std::to_string(q.outputs_off_format) + " output elements not " + run.output_format +
                " values";
      } else if (!q.output_ok) {
        line += " output " + format_double(q.eps_units) + " eps > tolerance";
      }
      out += line + "\n";
    }
    if (counts.failing_queries > static_cast<std::int64_t>(listed)) {
      out += "    \u2026 (" + std::to_string(counts.failing_queries - static_cast<std::int64_t>(listed)) +
             " more queries)\n";
    }

    if (const std::string resident = resident_text(s); !resident.empty()) out += "  " + resident + "\n";
    const auto& c = s.collisions;
    if (c.total() != 0) {
      out += "  collisions: " + std::to_string(c.same_step) + " same-step, " +
             std::to_string(c.outside_block) + " outside block, " + std::to_string(c.replaced_needed) +
             " replaced a row still needed" +
             (c.other_layer > 0 ? ", " + std::to_string(c.other_layer) + " over another layer's row (" +
                                      s.other_layer_detail + ")"
                                : std::string()) +
             "\n";
    }
    // The step's largest output error is taken as the run's: over the
    // queries that read their rows correctly (StepCounts); an error over
    // wrong rows measures the rows, not the kernel, and fails nothing.
    const auto queries = static_cast<std::int64_t>(s.queries.size());
    if (counts.worst_query >= 0 && counts.not_output_checked == queries) {
      out += "  outputs not judged in this step (" + std::to_string(queries) + " of " +
             std::to_string(queries) + " queries not output-checked)\n";
    } else if (counts.worst_query >= 0) {
      const auto& worst = s.queries[static_cast<std::size_t>(counts.worst_query)];
      out += "  max output error in step: " + format_double(counts.max_eps_units) + " eps (abs " +
             format_double(worst.abs_diff) + ", tolerance " + format_double(worst.tolerance) +
             (run.output_format.empty() ? std::string()
                                        : " of which " + run.output_format + " output rounding " +
                                              format_double(worst.output_rounding_tolerance)) +
             (exact_rows ? std::string() : ", quantization " + format_double(worst.quant_abs_diff)) +
             ") at query " + std::to_string(worst.position) + "\n";
    }
    if (counts.wrong_reads > 0) {
      out += "  " + std::to_string(counts.wrong_reads) + " of " + std::to_string(queries) +
             " queries read wrong rows: their output error is not judged\n";
    }
    if (!s.error.empty()) out += "  refusal: " + s.error + "\n";
    if (s.expectation_failed) out += "  expectation failed: " + s.expectation_detail + "\n";
    if (run.block_size > 0) out += paged_explanation(run, index);
  }
  if (run.queries > 0 && run.queries_not_output_checked == run.queries) {
    out += "  outputs not judged in this run (" + std::to_string(run.queries) + " of " +
           std::to_string(run.queries) + " queries not output-checked)\n";
  } else {
    out += "  max output error in run: " + format_double(run.max_eps_units) + " eps (abs " +
           format_double(run.max_abs_diff) +
           (exact_rows ? std::string() : ", with quantization " + format_double(run.max_quant_abs_diff)) +
           ")\n";
  }
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
    if (c.side_by_side) {
      out += "  " + side_by_side_text(*c.side_by_side) + "\n";
      for (const auto& d : c.side_by_side->differences) out += "  differs: " + d + "\n";
    }
    for (const auto& k : c.coverage) {
      out += "  coverage " + k.name + ": " + std::to_string(k.count) + " (minimum " +
             std::to_string(k.minimum) + ")" + (k.met() ? "" : "  BELOW MINIMUM") + "\n";
    }
    if (!c.counterexample_file.empty()) out += "  counterexample: " + c.counterexample_file + "\n";
    // A check's failing case (a side-by-side replay has failures and no case seed).
    if (c.shows_failing_case_seed()) out += "  failing case seed: " + std::to_string(c.failing_case_seed) + "\n";
    if (c.depends_on_earlier) {
      out += "  " + earlier_cases_text(*c.depends_on_earlier, c.failing_case_seed) + "\n";
      if (!c.depends_on_earlier->reproduced)
        out += "  first failure in its process: " + c.depends_on_earlier->first_failure_there + "\n";
    }
    if (!c.replay_command.empty() && !c.passed()) out += "  replay: " + c.replay_command + "\n";
  }
  for (const auto& part : report.parts) {
    out += "\n== " + part.title + " ==\n" + part.text;
    if (!part.text.empty() && part.text.back() != '\n') out += '\n';
    out += part_verdict_line(part);
  }
  out += "\n" + verdict_line(report);
  return out;
}

std::string part_verdict_line(const ReportPart& part) {
  return "=> " + part_verdict(part) +
         (part.planted_fault ? std::string(" (a planted fault: meant to be caught)") : std::string()) + "\n";
}

std::string verdict_line(const Report& report) {
  // The verdict line names what ran: a PASS over runs that were all refused
  // or skipped cannot be printed (Report::passed). A check's line is its
  // cases' (its runs are the counterexample, if any); a command of several
  // parts gives its parts' counts.
  return std::string(report.passed() ? "PASS" : "FAIL") + ": " +
         (report.check            ? check_counts_text(*report.check)
          : !report.parts.empty() ? part_counts_text(part_counts(report))
                                  : run_counts_text(run_counts(report))) +
         "\n";
}

}  // namespace kvcheck::reports
