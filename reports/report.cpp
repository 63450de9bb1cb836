// Report verdicts and the small formatting helpers every writer shares.
#include "reports/report.hpp"

#include <charconv>
#include <cmath>

namespace kvcheck::reports {

bool CheckSummary::passed() const noexcept {
  if (failures != 0) return false;
  for (const auto& c : coverage) {
    if (!c.met()) return false;
  }
  return true;
}

bool Report::passed() const noexcept {
  for (const auto& run : runs) {
    if (!run.passed) return false;
  }
  return !check.has_value() || check->passed();
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

std::string overwritten_counts(const properties::StepObservation& step) {
  std::vector<std::int64_t> counts;
  counts.reserve(step.queries.size());
  for (const auto& q : step.queries) counts.push_back(static_cast<std::int64_t>(q.overwritten.size()));
  return int_list(counts, 32);
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

}  // namespace kvcheck::reports
