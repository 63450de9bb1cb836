// JSON report writer. Field order is the order of insertion (ordered_json).
#include "reports/report_json.hpp"

#include <algorithm>
#include <cmath>

namespace kvcheck::reports {
namespace {

using Json = nlohmann::ordered_json;

// nlohmann writes NaN and Inf as null; say so explicitly so the schema is
// "number or null" and a reader knows null means "not finite".
Json number(double value) {
  if (!std::isfinite(value)) return nullptr;
  return value;
}

Json tag_json(const properties::ReadTag& tag) {
  Json j;
  j["slot"] = tag.slot;
  j["request"] = tag.request;
  j["position"] = tag.position;
  j["write_seq"] = tag.write_seq;
  // A prefix row stored again holds its source's content (docs/semantics.md "Row lineage").
  if (tag.origin_request >= 0) j["origin_request"] = tag.origin_request;
  return j;
}

/// The first kReportListItems entries of a per-query list: a forged trace
/// whose one read list names millions of slots must not write a report
/// millions of entries long. What is left out is counted in "omitted".
constexpr std::size_t kReportListItems = 256;

template <typename T>
std::size_t listed(const std::vector<T>& list) {
  return std::min(list.size(), kReportListItems);
}

/// `output_format`: the run declared one (its part of the tolerance is then listed).
Json query_json(const properties::QueryObservation& q, bool output_format) {
  Json j;
  j["position"] = q.position;
  j["visible"] = Json{{"first", q.visible_first}, {"last", q.position}};
  j["failed"] = query_failed(q);
  j["overwritten"] = std::vector<std::int64_t>(q.overwritten.begin(),
                                               q.overwritten.begin() + static_cast<std::ptrdiff_t>(listed(q.overwritten)));
  j["missing"] = std::vector<std::int64_t>(q.missing.begin(),
                                           q.missing.begin() + static_cast<std::ptrdiff_t>(listed(q.missing)));
  Json extra = Json::array();
  for (std::size_t i = 0; i < listed(q.extra); ++i) extra.push_back(tag_json(q.extra[i]));
  j["extra_reads"] = std::move(extra);
  if (q.overwritten.size() > kReportListItems || q.missing.size() > kReportListItems ||
      q.extra.size() > kReportListItems) {
    j["omitted"] = Json{{"overwritten", q.overwritten.size() - listed(q.overwritten)},
                        {"missing", q.missing.size() - listed(q.missing)},
                        {"extra_reads", q.extra.size() - listed(q.extra)}};
  }
  j["reads"] = static_cast<std::int64_t>(q.reads.size());
  Json out;
  out["abs_diff"] = number(q.abs_diff);
  out["rel_diff"] = number(q.rel_diff);
  out["eps_units"] = number(q.eps_units);
  out["quant_abs_diff"] = number(q.quant_abs_diff);
  out["tolerance"] = number(q.tolerance);
  out["rope_tolerance"] = number(q.rope_tolerance);
  if (output_format) {
    // Only for a cache that declares its output format: other reports keep their bytes.
    out["output_rounding_tolerance"] = number(q.output_rounding_tolerance);
    out["outputs_off_format"] = q.outputs_off_format;
  }
  out["ok"] = q.output_ok;
  j["output"] = std::move(out);
  return j;
}

Json step_json(const properties::StepObservation& s, bool output_format) {
  Json j;
  j["step"] = s.step;
  j["layer"] = s.layer;
  j["kind"] = s.kind;
  j["order"] = s.order;
  j["request"] = s.request;
  j["state"] = s.state;
  j["first_position"] = s.first_position;
  j["failed"] = step_failed(s);
  j["written_slots"] = s.written_slots;
  j["collisions"] = Json{{"same_step", s.collisions.same_step},
                         {"outside_block", s.collisions.outside_block},
                         {"replaced_needed", s.collisions.replaced_needed},
                         {"total", s.collisions.total()}};
  // A pool shared by the layers: only where there are any (other reports keep their bytes).
  if (s.collisions.other_layer > 0) {
    j["collisions"]["other_layer"] = s.collisions.other_layer;
    j["collisions"]["other_layer_detail"] = s.other_layer_detail;
  }
  j["overwritten_counts"] = overwritten_per_query(s);
  Json queries = Json::array();
  for (const auto& q : s.queries) queries.push_back(query_json(q, output_format));
  j["queries"] = std::move(queries);
  // Ring contents cost ring_rows numbers per step; keep them where they
  // explain something (failing steps) so long passing runs stay small.
  j["ring_positions"] = step_failed(s) ? Json(s.ring_positions) : Json::array();
  j["error"] = s.error;
  j["stored_rows_checked"] = s.stored_rows_checked;
  j["encoding_mismatches"] = s.encoding_mismatches;
  j["expectation_failed"] = s.expectation_failed;
  j["expectation_detail"] = s.expectation_detail;
  // Only for a cache that reports slot events or frees, or declares a bound:
  // other reports keep their bytes.
  if (s.resident_rows >= 0 ||
      s.padded_slots + s.moved_rows + s.freed_slots + s.cached_slots + s.evicted_rows + s.recomputed_rows >
          0) {
    j["resident"] = Json{{"rows", s.resident_rows},
                         {"blocks", s.resident_blocks},
                         {"bound", s.bound_limit},
                         {"bound_unit", s.bound_unit},
                         {"held", s.bound_held},
                         {"padded", s.padded_slots},
                         {"moved", s.moved_rows},
                         {"freed", s.freed_slots},
                         {"freed_visible", s.freed_visible},
                         {"freed_detail", s.freed_detail},
                         {"text", resident_text(s)}};
    // A cache that reports cached rows (docs/semantics.md "Cached rows"):
    // the other reports keep their bytes.
    if (s.cached_rows >= 0 || s.cached_slots + s.evicted_rows > 0) {
      j["resident"]["cached_rows"] = s.cached_rows;
      j["resident"]["cached_blocks"] = s.cached_blocks;
      j["resident"]["cached"] = s.cached_slots;
      j["resident"]["evicted"] = s.evicted_rows;
    }
    if (s.recomputed_rows > 0)  // prefix rows its begin left to it (docs/semantics.md "Recompute in a step")
      j["resident"]["recomputed"] = s.recomputed_rows;
    if (s.late_frees > 0) {  // a cache that declares a free deferral, past it
      j["resident"]["late_frees"] = s.late_frees;
      j["resident"]["late_detail"] = s.late_detail;
    }
  }
  return j;
}

// A paged run's block tables and block lifetimes at the step the text and
// the HTML picture (pictured_step), lists cut at kReportListItems.
Json paged_json(const properties::RunObservation& r) {
  const std::int64_t through = pictured_step(r);
  const PagedView view = paged_view(r, through);
  Json j;
  j["block_size"] = r.block_size;
  j["pool_blocks"] = r.pool_blocks;
  j["layer"] = view.layer;
  j["through_step"] = view.through_step;
  j["blocks"] = view.blocks;
  j["reuses"] = view.reuses;
  j["reused_by_other_request"] = view.reused_by_other;
  Json tables = Json::array();
  for (const auto& t : view.tables) {
    Json entries = Json::array();
    for (std::size_t i = 0; i < listed(t.entries); ++i) {
      const auto& e = t.entries[i];
      entries.push_back(Json{{"logical", e.logical}, {"physical", e.physical}, {"held", e.held}});
    }
    tables.push_back(Json{{"request", t.request}, {"blocks", std::move(entries)},
                          {"omitted", t.entries.size() - listed(t.entries)}});
  }
  j["block_tables"] = std::move(tables);
  Json lifetimes = Json::array();
  for (std::size_t i = 0; i < listed(view.lifetimes); ++i) {
    const auto& t = view.lifetimes[i];
    Json l;
    l["block"] = t.block;
    l["request"] = t.request;
    l["logical"] = t.logical;
    l["first_written_step"] = t.first_written_step;
    l["last_used_step"] = t.last_used_step;
    l["ended_step"] = t.ended_step;
    l["next_request"] = t.next_request;
    l["next_logical"] = t.next_logical;
    lifetimes.push_back(std::move(l));
  }
  j["block_lifetimes"] = std::move(lifetimes);
  j["lifetimes_omitted"] = view.lifetimes.size() - listed(view.lifetimes);
  return j;
}

Json run_json(const properties::RunObservation& r) {
  Json j;
  j["scenario"] = r.scenario_name;
  j["backend"] = r.backend;
  j["fault"] = r.fault;
  j["window"] = Json{{"convention", r.window_convention}, {"keys", r.window_keys}, {"parameter", r.window}};
  if (!r.layer_window_keys.empty()) {
    // Only when the scenario gives each layer its own window: other reports keep their bytes.
    Json layers = Json::array();
    for (const std::int64_t keys : r.layer_window_keys) layers.push_back(keys == 0 ? Json(nullptr) : Json(keys));
    j["window"]["layer_keys"] = std::move(layers);
  }
  j["ring_rows"] = r.ring_rows;
  j["format"] = r.format;
  // Only for a cache that declares its output format: other reports keep their bytes.
  if (!r.output_format.empty()) j["output_format"] = r.output_format;
  j["precision_bits"] = r.precision_bits;
  j["verdict"] = r.skipped ? "skip" : (r.passed ? "pass" : "fail");
  j["first_failure"] = r.first_failure;
  j["refused"] = r.refused;
  j["skip_reason"] = r.skip_reason;
  j["observed"] = r.observed;
  j["probes"] = r.probes;
  j["first_failing_step"] = first_failing_step(r);
  Json totals;
  totals["steps"] = steps_observed(r);
  totals["queries"] = r.queries;
  totals["queries_not_output_checked"] = r.queries_not_output_checked;
  totals["lost_rows"] = r.lost_rows;
  totals["extra_reads"] = r.extra_reads;
  totals["collisions"] = r.collisions;
  totals["output_failures"] = r.output_failures;
  totals["max_abs_diff"] = number(r.max_abs_diff);
  totals["max_eps_units"] = number(r.max_eps_units);
  totals["max_quant_abs_diff"] = number(r.max_quant_abs_diff);
  totals["max_rope_tolerance"] = number(r.max_rope_tolerance);
  if (!r.output_format.empty())
    totals["max_output_rounding_tolerance"] = number(r.max_output_rounding_tolerance);
  totals["stored_rows_checked"] = r.stored_rows_checked;
  totals["encoding_mismatches"] = r.encoding_mismatches;
  totals["mpfr_queries"] = r.mpfr_queries;
  // Only when not zero (a cache that frees or declares a bound): other reports keep their bytes.
  if (r.freed_visible > 0) totals["freed_visible"] = r.freed_visible;
  if (r.steps_over_bound > 0) totals["steps_over_bound"] = r.steps_over_bound;
  if (r.late_frees > 0) totals["late_frees"] = r.late_frees;
  j["totals"] = std::move(totals);
  Json steps = Json::array();
  for (const auto& s : r.steps) steps.push_back(step_json(s, !r.output_format.empty()));
  j["steps"] = std::move(steps);
  if (r.block_size > 0) j["paged"] = paged_json(r);
  if (!r.prefixes.empty()) {
    // Only for a run with shared prefixes: other reports keep their bytes.
    Json prefixes = Json::array();
    for (const auto& p : r.prefixes) {
      Json one{{"request", p.request},           {"source", p.source},         {"positions", p.positions},
               {"stored_again", p.stored_again}, {"begin_step", p.begin_step}, {"text", prefix_text(p)}};
      if (p.recomputed_in_step > 0) one["recomputed_in_step"] = p.recomputed_in_step;
      prefixes.push_back(std::move(one));
    }
    j["prefixes"] = std::move(prefixes);
  }
  return j;
}

Json check_json(const CheckSummary& c) {
  Json j;
  j["verdict"] = c.passed() ? "pass" : "fail";
  j["cases"] = c.cases;
  j["ran"] = c.ran();
  j["refused"] = c.refused;
  j["skipped"] = c.skipped;
  j["min_run_share"] = c.min_run_share;
  j["run_share_met"] = c.run_share_met();
  j["failures"] = c.failures;
  j["queries"] = c.queries;
  j["queries_not_output_checked"] = c.queries_not_output_checked;
  Json coverage = Json::array();
  for (const auto& k : c.coverage) {
    coverage.push_back(Json{{"name", k.name}, {"count", k.count}, {"minimum", k.minimum}, {"met", k.met()}});
  }
  j["coverage"] = std::move(coverage);
  j["counterexample_file"] = c.counterexample_file;
  j["replay_command"] = c.replay_command;
  j["failing_case_seed"] = c.failing_case_seed;
  // Every failing case, so a new failure shows beside known ones: the first
  // kListedFailingCases seeds, and how many failing cases are not listed.
  j["failing_case_seeds"] = c.failing_case_seeds;
  j["failing_case_seeds_omitted"] = c.failures - static_cast<std::int64_t>(c.failing_case_seeds.size());
  j["observed"] = c.observed;
  if (c.cases_not_run > 0) {
    // Only for a check --max-failures stopped: the cases after it never counted.
    j["stopped"] = Json{{"max_failures", c.max_failures}, {"cases_not_run", c.cases_not_run}};
  }
  if (c.side_by_side) {
    // Only for two caches side by side.
    const SideBySide& b = *c.side_by_side;
    j["side_by_side"] = Json{{"property", b.property},
                             {"first", b.first},
                             {"second", b.second},
                             {"bitwise", b.bitwise},
                             {"cases_compared", b.compared.cases},
                             {"steps_compared", b.compared.steps},
                             {"resident_compared", b.compared.resident},
                             {"queries_compared", b.compared.queries},
                             {"reads_compared", b.compared.reads},
                             {"outputs_compared", b.compared.outputs},
                             {"cases_both_stopped", b.compared.both_stopped},
                             {"differences", b.differences}};
    // Only where --bitwise compared in a narrower declared output format.
    if (!b.compared.bitwise_format.empty()) j["side_by_side"]["bitwise_format"] = b.compared.bitwise_format;
  }
  if (c.depends_on_earlier) {
    // Only for a failure that passes alone in a fresh cache.
    const EarlierCases& e = *c.depends_on_earlier;
    Json d;
    d["earlier_cases_run"] = e.earlier_cases_run;
    d["case_seeds_before"] = e.case_seeds;
    d["files_before"] = e.files;
    d["reproduced_with_them"] = e.reproduced;
    d["first_failure_in_process"] = e.first_failure_there;
    j["depends_on_earlier_cases"] = std::move(d);
  }
  return j;
}

}  // namespace

Json report_to_json(const Report& report) {
  const RunCounts counts = run_counts(report);
  const std::int64_t failed = counts.failed;
  const auto& ctx = report.context;

  Json j;
  j["report_version"] = kReportVersion;
  j["schema_version"] = kReportSchemaVersion;
  j["name"] = "kvcheck report";
  j["description"] =
      std::to_string(report.runs.size()) + " run(s) on backend " + ctx.backend + ", fault " + ctx.fault +
      ": " + std::to_string(failed) + " failed" +
      (report.check ? ", property check " + std::string(report.check->passed() ? "passed" : "failed")
                    : std::string());
  j["verdict"] = report.passed() ? "pass" : "fail";
  j["context"] = Json{{"tool_version", ctx.tool_version},
                      {"seed", ctx.seed},
                      {"backend", ctx.backend},
                      {"fault", ctx.fault},
                      {"precision_bits", ctx.precision_bits},
                      {"precision_requested", ctx.precision_requested},
                      {"command", ctx.command}};
  // passed_runs counts runs that did not fail (skipped ones included, as
  // before); ran_runs, refused_runs and skipped_runs say how many ran at all.
  j["summary"] = Json{{"runs", counts.runs},
                      {"passed_runs", counts.runs - failed},
                      {"failed_runs", failed},
                      {"ran_runs", counts.ran},
                      {"refused_runs", counts.refused},
                      {"skipped_runs", counts.skipped},
                      {"queries", counts.queries},
                      {"queries_not_output_checked", counts.queries_not_output_checked}};
  j["check"] = report.check ? check_json(*report.check) : Json(nullptr);
  Json runs = Json::array();
  for (const auto& r : report.runs) runs.push_back(run_json(r));
  j["runs"] = std::move(runs);
  if (!report.parts.empty()) {
    // Only for a command of several parts (the demo): each part's own
    // verdict, text, command, check and runs, and their counts.
    const PartCounts pc = part_counts(report);
    j["summary"]["parts"] = pc.parts;
    j["summary"]["parts_as_meant"] = pc.as_meant;
    j["summary"]["planted_faults"] = pc.planted;
    j["summary"]["planted_faults_caught"] = pc.caught;
    Json parts = Json::array();
    for (const auto& part : report.parts) {
      Json p;
      p["title"] = part.title;
      p["verdict"] = part_verdict(part);
      p["planted_fault"] = part.planted_fault;
      p["failed"] = part.failed;
      p["as_meant"] = part.as_meant();
      p["command"] = part.context.command;
      p["text"] = part.text;
      p["check"] = part.check ? check_json(*part.check) : Json(nullptr);
      Json part_runs = Json::array();
      for (const auto& r : part.runs) part_runs.push_back(run_json(r));
      p["runs"] = std::move(part_runs);
      parts.push_back(std::move(p));
    }
    j["parts"] = std::move(parts);
  }
  return j;
}

std::string report_json_text(const Report& report) {
  // Names and commands come from user files; replace bad UTF-8 rather than
  // throw halfway through writing a report.
  return report_to_json(report).dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace kvcheck::reports
