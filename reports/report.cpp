// Report verdicts and the small formatting helpers every writer shares.
#include "reports/report.hpp"

#include <charconv>
#include <cmath>

namespace kvcheck::reports {

bool CheckSummary::run_share_met() const noexcept {
  return static_cast<double>(ran()) >= min_run_share * static_cast<double>(cases);
}

bool CheckSummary::passed() const noexcept {
  if (failures != 0 || !run_share_met()) return false;
  for (const auto& c : coverage) {
    if (!c.met()) return false;
  }
  return true;
}

bool Report::passed() const noexcept {
  for (const auto& run : runs) {
    if (!run.passed) return false;
  }
  for (const auto& part : parts) {
    if (!part.as_meant()) return false;
  }
  if (check) return check->passed();
  // Parts are the verdict of a command that runs several.
  if (!parts.empty()) return true;
  // Without a check the runs are the verdict: all of them skipped (or none
  // at all) is no verdict, never a PASS.
  return run_counts(*this).ran > 0;
}

RunCounts run_counts(const Report& report) noexcept {
  RunCounts c;
  for (const auto& run : report.runs) {
    ++c.runs;
    if (run.skipped) {
      ++(run.refused ? c.refused : c.skipped);
      c.failed += run.passed ? 0 : 1;
      continue;
    }
    ++c.ran;
    ++(run.passed ? c.passed : c.failed);
    c.queries += run.queries;
    c.queries_not_output_checked += run.queries_not_output_checked;
  }
  return c;
}

Report part_report(const ReportPart& part) {
  Report r;
  r.context = part.context;
  r.runs = part.runs;
  r.check = part.check;
  return r;
}

PartCounts part_counts(const Report& report) noexcept {
  PartCounts c;
  for (const auto& part : report.parts) {
    ++c.parts;
    c.as_meant += part.as_meant() ? 1 : 0;
    c.planted += part.planted_fault ? 1 : 0;
    c.caught += part.planted_fault && part.failed ? 1 : 0;
  }
  return c;
}

std::string part_counts_text(const PartCounts& c) {
  return std::to_string(c.parts) + (c.parts == 1 ? " part: " : " parts: ") + std::to_string(c.as_meant) +
         " showed what they should; " + std::to_string(c.caught) + " of " + std::to_string(c.planted) +
         " planted faults caught";
}

std::string part_verdict(const ReportPart& part) {
  if (part.planted_fault) return part.failed ? "CAUGHT" : "MISSED";
  return part.failed ? "FAIL" : "PASS";
}

std::string run_counts_text(const RunCounts& c) {
  std::string out = std::to_string(c.runs) + (c.runs == 1 ? " run: " : " runs: ");
  out += c.ran == 0 ? std::string("no run ran")
                    : std::to_string(c.ran) + " ran (" + std::to_string(c.passed) + " passed, " +
                          std::to_string(c.failed) + " failed)";
  out += ", " + std::to_string(c.refused) + " refused, " + std::to_string(c.skipped) + " skipped; " +
         std::to_string(c.queries_not_output_checked) + " of " + std::to_string(c.queries) +
         " queries not output-checked";
  return out;
}

std::string check_counts_text(const CheckSummary& c) {
  std::string out = std::to_string(c.cases) + " cases: " + std::to_string(c.ran()) + " ran, " +
                    std::to_string(c.refused) + " refused, " + std::to_string(c.skipped) + " skipped";
  if (!c.run_share_met()) {
    out += " (below the minimum share " + format_double(c.min_run_share) + " of cases run)";
  }
  out += "; " + std::to_string(c.failures) + " failed; " + std::to_string(c.queries_not_output_checked) +
         " of " + std::to_string(c.queries) + " queries not output-checked";
  return out;
}

std::int64_t steps_observed(const properties::RunObservation& run) noexcept {
  // Observations come in step order, one per layer of a step.
  std::int64_t steps = 0;
  std::int64_t last = -1;
  for (const auto& s : run.steps) {
    if (steps == 0 || s.step != last) ++steps;
    last = s.step;
  }
  return steps;
}

StepCounts step_counts(const properties::StepObservation& step) noexcept {
  StepCounts c;
  for (std::size_t i = 0; i < step.queries.size(); ++i) {
    const auto& q = step.queries[i];
    c.overwritten += static_cast<std::int64_t>(q.overwritten.size());
    c.missing += static_cast<std::int64_t>(q.missing.size());
    c.extra += static_cast<std::int64_t>(q.extra.size());
    c.failing_queries += q.failed ? 1 : 0;
    c.output_failures += q.output_ok ? 0 : 1;
    c.not_output_checked += q.output_checked ? 0 : 1;
    if (!properties::reads_correct(q)) {
      ++c.wrong_reads;
      continue;
    }
    // The run's maximum is taken the same way (properties/verdict.cpp).
    if (c.worst_query < 0 || q.eps_units > c.max_eps_units) {
      c.max_eps_units = q.eps_units;
      c.worst_query = static_cast<std::int64_t>(i);
    }
  }
  return c;
}

bool format_stores_exact_rows(std::string_view format) noexcept {
  return format == "f64";
}

std::string window_text(const properties::RunObservation& run) {
  return std::to_string(run.window) + "(" + run.window_convention + ")";
}

// The verdicts are computed once, by the runner (properties/runner.cpp), and
// stored with each observation; writers only read them.
bool query_failed(const properties::QueryObservation& query) noexcept {
  return query.failed;
}

bool step_failed(const properties::StepObservation& step) noexcept {
  return step.failed;
}

std::int64_t first_failing_step(const properties::RunObservation& run) noexcept {
  return run.first_failing_step;
}

std::int64_t focus_query(const properties::StepObservation& step) noexcept {
  for (std::size_t i = 0; i < step.queries.size(); ++i) {
    if (query_failed(step.queries[i])) return static_cast<std::int64_t>(i);
  }
  return static_cast<std::int64_t>(step.queries.size()) - 1;
}

std::vector<std::int64_t> overwritten_per_query(const properties::StepObservation& step) {
  std::vector<std::int64_t> counts;
  counts.reserve(step.queries.size());
  for (const auto& q : step.queries) counts.push_back(static_cast<std::int64_t>(q.overwritten.size()));
  return counts;
}

std::string overwritten_counts(const properties::StepObservation& step) {
  return int_list(overwritten_per_query(step), 32);
}

std::string int_list(const std::vector<std::int64_t>& values, std::size_t limit) {
  std::string out = "[";
  const std::size_t shown = values.size() <= limit ? values.size() : limit;
  for (std::size_t i = 0; i < shown; ++i) {
    if (i != 0) out += ',';
    out += std::to_string(values[i]);
  }
  if (shown < values.size()) {
    out += ",\u2026 (" + std::to_string(values.size() - shown) + " more)";
  }
  out += ']';
  return out;
}

std::string format_double(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // std::to_chars without a precision gives the shortest round-trip form, the
  // same on every platform; printf("%g") would not round-trip.
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string replay_command(const Report& report) {
  if (report.check && !report.check->replay_command.empty()) return report.check->replay_command;
  return report.context.command;
}

std::string earlier_cases_text(const EarlierCases& earlier, std::uint64_t failing_case_seed) {
  std::string seeds;
  for (std::size_t j = 0; j < earlier.case_seeds.size(); ++j) {
    if (j == 16) {
      seeds += ", ... (" + std::to_string(earlier.case_seeds.size() - j) + " more)";
      break;
    }
    seeds += (j == 0 ? "" : ", ") + std::to_string(earlier.case_seeds[j]);
  }
  std::string out = "depends on earlier cases: case seed " + std::to_string(failing_case_seed) +
                    " failed after " + std::to_string(earlier.earlier_cases_run) +
                    " earlier cases in its process but passes alone in a fresh cache (state kept across "
                    "close/open); ";
  out += earlier.reproduced ? "reproduced" : "not reproduced";
  out += " in a fresh cache after the " + std::to_string(earlier.case_seeds.size()) + " case(s) before it";
  if (!seeds.empty()) out += " (case seeds " + seeds + ")";
  return out;
}

}  // namespace kvcheck::reports
