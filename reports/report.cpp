// Report verdicts and the small formatting helpers every writer shares.
#include "reports/report.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <utility>

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
  if (c.cases_not_run > 0) {
    out += "; stopped after " + std::to_string(c.max_failures) + " failing cases (--max-failures " +
           std::to_string(c.max_failures) + "): " + std::to_string(c.cases_not_run) + " cases not run";
  }
  return out;
}

std::string side_by_side_text(const SideBySide& s) {
  return s.property + " of " + s.first + " (A) and " + s.second + " (B), outputs " +
         (s.bitwise
              ? "bit for bit" + (s.compared.bitwise_format.empty()
                                     ? std::string()
                                     : " in " + s.compared.bitwise_format + " (the wider side rounded once)")
              : std::string("within the larger tolerance")) +
         ": " + std::to_string(s.compared.cases) + " cases, " + std::to_string(s.compared.steps) +
         " steps (" + std::to_string(s.compared.resident) + " resident sets), " +
         std::to_string(s.compared.queries) + " queries compared (" + std::to_string(s.compared.reads) +
         " reads, " + std::to_string(s.compared.outputs) + " outputs)" +
         // Only when there were any: other lines keep their text.
         (s.compared.both_stopped > 0 ? "; " + std::to_string(s.compared.both_stopped) +
                                            " cases where both crashed or refused (not agreements)"
                                      : std::string());
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

std::string resident_text(const properties::StepObservation& s) {
  std::string out;
  if (s.resident_rows >= 0) {
    out = "resident " + std::to_string(s.resident_rows) + " rows";
    if (s.resident_blocks >= 0) out += ", " + std::to_string(s.resident_blocks) + " blocks";
    if (s.bound_limit > 0) {
      out += " (bound " + std::to_string(s.bound_limit) + " " + s.bound_unit + ": held " +
             std::to_string(s.bound_held) + ")";
    }
    // Cached rows apart from the rows held (docs/semantics.md "Cached rows").
    if (s.cached_rows >= 0) {
      out += ", cached " + std::to_string(s.cached_rows) + " rows";
      if (s.cached_blocks >= 0) out += ", " + std::to_string(s.cached_blocks) + " blocks";
    }
  }
  if (s.padded_slots + s.moved_rows + s.freed_slots + s.cached_slots + s.evicted_rows + s.recomputed_rows >
      0) {
    out += (out.empty() ? "" : "; ") + std::string("padded ") + std::to_string(s.padded_slots) + ", moved " +
           std::to_string(s.moved_rows) + ", freed " + std::to_string(s.freed_slots);
    if (s.cached_slots + s.evicted_rows > 0)
      out += ", cached " + std::to_string(s.cached_slots) + ", evicted " + std::to_string(s.evicted_rows);
    if (s.freed_visible > 0) out += " (" + std::to_string(s.freed_visible) + " still visible)";
    if (s.recomputed_rows > 0) out += ", recomputed " + std::to_string(s.recomputed_rows);
  }
  if (s.late_frees > 0)
    out += (out.empty() ? "" : "; ") + std::to_string(s.late_frees) + " blocks freed late";
  return out;
}

std::string prefix_text(const properties::PrefixObservation& p) {
  const std::int64_t shared = p.positions - p.stored_again - p.recomputed_in_step;
  std::string how =
      p.stored_again == 0 && p.recomputed_in_step == 0 ? "shared"
      : shared == 0 && p.recomputed_in_step == 0
          ? "stored again"
          : std::to_string(p.stored_again) + " stored again, " + std::to_string(shared) + " shared";
  // Left to its next writing step (docs/semantics.md "Recompute in a step").
  if (p.recomputed_in_step > 0)
    how += ", " + std::to_string(p.recomputed_in_step) + " recomputed in its first step";
  return "request " + std::to_string(p.request) + " began from request " + std::to_string(p.source) +
         "'s first " + std::to_string(p.positions) + (p.positions == 1 ? " position (" : " positions (") + how +
         ")";
}

const properties::PrefixObservation* prefix_begun_at(const properties::RunObservation& run,
                                                     const properties::StepObservation& step) noexcept {
  for (const auto& p : run.prefixes) {
    if (p.begin_step == step.step && p.request == step.request) return &p;
  }
  return nullptr;
}

std::vector<std::string> prefix_lines(const properties::RunObservation& run, std::int64_t through,
                                      std::size_t limit) {
  std::vector<std::string> lines;
  std::size_t more = 0;
  for (const auto& p : run.prefixes) {
    if (through >= 0 && p.begin_step > through) continue;
    if (lines.size() < limit) {
      lines.push_back(prefix_text(p));
    } else {
      ++more;
    }
  }
  if (more > 0) lines.push_back("\u2026 (" + std::to_string(more) + " more)");
  return lines;
}

std::string window_text(const properties::RunObservation& run) {
  std::string out = std::to_string(run.window) + "(" + run.window_convention + ")";
  if (!run.layer_window_keys.empty()) out += " layers=" + layer_windows_text(run);
  return out;
}

std::string layer_windows_text(const properties::RunObservation& run) {
  std::string out;
  for (std::size_t l = 0; l < run.layer_window_keys.size(); ++l) {
    const std::int64_t keys = run.layer_window_keys[l];
    out += (l == 0 ? "" : ",") + (keys == 0 ? std::string("global") : std::to_string(keys));
  }
  return out.empty() ? out : out + " keys";
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

std::int64_t pictured_step(const properties::RunObservation& run) noexcept {
  std::int64_t index = first_failing_step(run);
  if (index >= 0) return index;
  for (std::size_t k = run.steps.size(); k-- > 0;) {
    if (!run.steps[k].queries.empty()) return static_cast<std::int64_t>(k);
  }
  return static_cast<std::int64_t>(run.steps.size()) - 1;
}

PagedView paged_view(const properties::RunObservation& run, std::int64_t through) {
  PagedView view;
  if (run.block_size <= 0 || through < 0 || through >= static_cast<std::int64_t>(run.steps.size())) return view;
  const std::int64_t b = run.block_size;
  view.block_size = b;
  view.layer = run.steps[static_cast<std::size_t>(through)].layer;
  view.through_step = run.steps[static_cast<std::size_t>(through)].step;
  std::map<std::int64_t, std::size_t> current;                             // block -> its tenancy
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> mapping;  // (request, logical) -> block
  for (std::int64_t i = 0; i <= through; ++i) {
    const auto& s = run.steps[static_cast<std::size_t>(i)];
    if (s.layer != view.layer) continue;
    for (std::size_t k = 0; k < s.written_slots.size(); ++k) {
      const std::int64_t slot = s.written_slots[k];
      const std::int64_t position = s.first_position + static_cast<std::int64_t>(k);
      if (slot < 0 || position < 0) continue;
      const std::int64_t block = slot / b;
      const std::int64_t logical = position / b;
      mapping[{s.request, logical}] = block;
      const auto it = current.find(block);
      if (it != current.end()) {
        BlockTenancy& t = view.lifetimes[it->second];
        if (t.request == s.request && t.logical == logical) {
          t.last_used_step = s.step;
          continue;
        }
        t.ended_step = s.step;
        t.next_request = s.request;
        t.next_logical = logical;
        ++view.reuses;
        if (t.request != s.request) ++view.reused_by_other;
      } else {
        ++view.blocks;
      }
      current[block] = view.lifetimes.size();
      view.lifetimes.push_back(BlockTenancy{block, s.request, logical, s.step, s.step, -1, -1, -1});
    }
    for (const auto& q : s.queries) {
      for (const auto& r : q.reads) {
        if (r.slot < 0) continue;
        const auto it = current.find(r.slot / b);
        if (it == current.end()) continue;
        BlockTenancy& t = view.lifetimes[it->second];
        if (t.request == s.request) t.last_used_step = s.step;
      }
    }
  }
  for (const auto& [key, block] : mapping) {
    if (view.tables.empty() || view.tables.back().request != key.first)
      view.tables.push_back(RequestBlockTable{key.first, {}});
    const BlockTenancy& t = view.lifetimes[current.at(block)];
    view.tables.back().entries.push_back(
        BlockTableEntry{key.second, block, t.request == key.first && t.logical == key.second});
  }
  return view;
}

const BlockTenancy* tenancy_of(const PagedView& view, const properties::RunObservation& run, std::int64_t through,
                               std::int64_t request, std::int64_t position) noexcept {
  if (view.block_size <= 0 || position < 0 || through < 0) return nullptr;
  // The step (of the view's layer, up to `through`) that last wrote the
  // position for the request, and the block it wrote it to.
  const std::int64_t last = std::min<std::int64_t>(through, static_cast<std::int64_t>(run.steps.size()) - 1);
  for (std::int64_t i = last; i >= 0; --i) {
    const auto& s = run.steps[static_cast<std::size_t>(i)];
    if (s.layer != view.layer || s.request != request) continue;
    const std::int64_t k = position - s.first_position;
    if (k < 0 || k >= static_cast<std::int64_t>(s.written_slots.size())) continue;
    const std::int64_t slot = s.written_slots[static_cast<std::size_t>(k)];
    if (slot < 0) continue;
    // The tenancy in force then: the latest of that block, request and
    // logical block begun at or before that step (a later one of the same
    // request began after another tenant took the block between).
    const std::int64_t block = slot / view.block_size;
    const std::int64_t logical = position / view.block_size;
    for (std::size_t j = view.lifetimes.size(); j-- > 0;) {
      const BlockTenancy& t = view.lifetimes[j];
      if (t.block == block && t.request == request && t.logical == logical && t.first_written_step <= s.step)
        return &t;
    }
    return nullptr;
  }
  return nullptr;
}

std::string tenancy_text(const BlockTenancy& t) {
  std::string out = "block " + std::to_string(t.block) + " (request " + std::to_string(t.request) +
                    "'s block " + std::to_string(t.logical) + "): written at step " +
                    std::to_string(t.first_written_step) + ", last used at step " +
                    std::to_string(t.last_used_step) + ", ";
  if (t.ended_step < 0) return out + "still held";
  out += t.next_request == t.request ? "reused by the same request" : "reused by request " + std::to_string(t.next_request);
  return out + " (its block " + std::to_string(t.next_logical) + ") at step " + std::to_string(t.ended_step);
}

std::string block_table_text(const RequestBlockTable& table, std::size_t limit) {
  std::string out = "[";
  const std::size_t shown = std::min(table.entries.size(), limit);
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& e = table.entries[i];
    if (i != 0) out += ", ";
    out += std::to_string(e.logical) + ":" + std::to_string(e.physical) + (e.held ? "" : " reused");
  }
  if (shown < table.entries.size()) out += ", \u2026 (" + std::to_string(table.entries.size() - shown) + " more)";
  return out + "]";
}

std::string paged_counts_text(const PagedView& view) {
  return std::to_string(view.blocks) + " blocks written, " + std::to_string(view.reuses) + " reuses (" +
         std::to_string(view.reused_by_other) + " by another request)";
}

}  // namespace kvcheck::reports
