#include "properties/verdict.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "support/assert.hpp"

namespace kvcheck::properties {

namespace {

std::string fmt_g(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

std::string list_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

void mark_failed(RunObservation* run, const std::string& why) {
  if (run->passed) run->first_failure = why;
  run->passed = false;
}

void judge_run(const scenarios::Scenario& sc, RunObservation* out) {
  RunObservation& run = *out;
  auto fail = [&run](const std::string& why) { mark_failed(&run, why); };
  std::map<std::int64_t, const scenarios::OverwriteExpectation*> expected;
  if (sc.expect) {
    for (const auto& e : sc.expect->overwritten) expected[e.step] = &e;
  }
  const std::int64_t allowed = sc.expect && sc.expect->collisions ? *sc.expect->collisions : 0;
  std::int64_t collisions_so_far = 0;
  // Counted from the queries' own flags (set by the runner), so the total and
  // the per-query fields cannot disagree; assigned, not added, so a runner
  // that already set the total gets the same figure.
  std::int64_t not_output_checked = 0;
  for (auto& obs : run.steps) {
    const auto it = expected.find(obs.step);
    std::vector<std::int64_t> counts;
    for (auto& q : obs.queries) {
      counts.push_back(static_cast<std::int64_t>(q.overwritten.size()));
      run.lost_rows += static_cast<std::int64_t>(q.overwritten.size() + q.missing.size());
      run.extra_reads += static_cast<std::int64_t>(q.extra.size());
      const bool reads_correct = properties::reads_correct(q);
      // Output errors of queries that read wrong rows are reported per query
      // but not in the run's maxima, which describe the kernel's arithmetic.
      if (reads_correct) {
        run.max_rope_tolerance = std::max(run.max_rope_tolerance, q.rope_tolerance);
        run.max_output_rounding_tolerance =
            std::max(run.max_output_rounding_tolerance, q.output_rounding_tolerance);
        run.max_abs_diff = std::max(run.max_abs_diff, q.abs_diff);
        run.max_eps_units = std::max(run.max_eps_units, q.eps_units);
        run.max_quant_abs_diff = std::max(run.max_quant_abs_diff, q.quant_abs_diff);
      }
      ++run.queries;
      not_output_checked += q.output_checked ? 0 : 1;
      // With an expectation for the step, its overwritten counts are judged
      // as a list; missing and extra reads still fail the query.
      const bool reads_fail =
          it != expected.end() ? (!q.missing.empty() || !q.extra.empty()) : !reads_correct;
      q.failed = !q.output_ok || reads_fail;
      if (!q.output_ok) {
        ++run.output_failures;
        const std::string where = "step " + std::to_string(obs.step) + " layer " + std::to_string(obs.layer) +
                                  " query " + std::to_string(q.position) + ": ";
        if (q.outputs_off_format > 0) {
          fail(where + std::to_string(q.outputs_off_format) + " output elements are not " +
               run.output_format + " values, the output format the cache declares");
        } else {
          // The output format's term is named where one was declared.
          const std::string rounding = run.output_format.empty()
                                           ? std::string()
                                           : ", of which " + run.output_format + " output rounding " +
                                                 fmt_g(q.output_rounding_tolerance);
          fail(where + "output differs by " + fmt_g(q.abs_diff) + " (tolerance " + fmt_g(q.tolerance) +
               rounding + ", " + fmt_g(q.eps_units) + " eps)");
        }
      }
      if (reads_fail) {
        if (it == expected.end() && !obs.expectation_failed) {
          obs.expectation_failed = true;
          obs.expectation_detail = "query " + std::to_string(q.position) +
                                   " lost or misread rows, and the scenario expects none here";
        }
        fail("step " + std::to_string(obs.step) + " (" + obs.kind + ") layer " + std::to_string(obs.layer) +
             " query " + std::to_string(q.position) + ": overwritten " + list_text(q.overwritten) +
             ", missing " + list_text(q.missing) + ", " + std::to_string(q.extra.size()) + " extra reads");
      }
    }
    if (it != expected.end() && counts != it->second->counts) {
      obs.expectation_failed = true;
      obs.expectation_detail =
          "expected overwritten " + list_text(it->second->counts) + ", observed " + list_text(counts);
      fail("step " + std::to_string(obs.step) + " layer " + std::to_string(obs.layer) + ": " +
           obs.expectation_detail);
    }
    run.collisions += obs.collisions.total();
    collisions_so_far += obs.collisions.total();
    bool collision_fail = false;
    if (obs.collisions.total() > 0 && collisions_so_far > allowed) {
      // The first step past the allowed total fails, and every later step with collisions.
      collision_fail = true;
      // Other-layer collisions (a pool shared by the layers) are named only
      // where there are any: other runs keep their lines.
      const std::string other_layer = obs.collisions.other_layer > 0
                                          ? ", " + std::to_string(obs.collisions.other_layer) + " other-layer"
                                          : "";
      fail("step " + std::to_string(obs.step) + " (" + obs.kind +
           "): " + std::to_string(obs.collisions.same_step) + " same-step, " +
           std::to_string(obs.collisions.outside_block) + " outside-block, " +
           std::to_string(obs.collisions.replaced_needed) + " replaced-needed" + other_layer +
           " collisions (expected " + std::to_string(allowed) + " in all)" +
           (obs.other_layer_detail.empty() ? "" : "; first other-layer: " + obs.other_layer_detail));
    }
    if (!obs.error.empty()) {
      fail("step " + std::to_string(obs.step) + " (" + obs.kind + "): " + obs.error);
    }
    run.stored_rows_checked += obs.stored_rows_checked;
    run.encoding_mismatches += obs.encoding_mismatches;
    if (obs.encoding_mismatches > 0) {
      fail("step " + std::to_string(obs.step) + " (" + obs.kind + ") layer " + std::to_string(obs.layer) +
           ": " + std::to_string(obs.encoding_mismatches) +
           " stored rows differ from the reference encoding; first: " + obs.encoding_detail);
    }
    run.freed_visible += obs.freed_visible;
    if (obs.freed_visible > 0) {
      fail("step " + std::to_string(obs.step) + " (" + obs.kind + ") layer " + std::to_string(obs.layer) +
           ": freed " + std::to_string(obs.freed_visible) + " rows still visible; first: " + obs.freed_detail);
    }
    run.late_frees += obs.late_frees;
    if (obs.late_frees > 0) {
      fail("step " + std::to_string(obs.step) + " (" + obs.kind + ") layer " + std::to_string(obs.layer) +
           ": " + std::to_string(obs.late_frees) +
           " blocks freed later than declared; first: " + obs.late_detail);
    }
    const bool over_bound = obs.bound_limit > 0 && obs.bound_held > obs.bound_limit;
    if (over_bound) {
      ++run.steps_over_bound;
      fail("step " + std::to_string(obs.step) + " (" + obs.kind + ") layer " + std::to_string(obs.layer) +
           ": holds " + std::to_string(obs.bound_held) + " " + obs.bound_unit +
           ", over its declared resident bound of " + std::to_string(obs.bound_limit));
    }
    obs.failed = collision_fail || obs.expectation_failed || !obs.error.empty() ||
                 obs.encoding_mismatches > 0 || obs.freed_visible > 0 || obs.late_frees > 0 || over_bound ||
                 std::any_of(obs.queries.begin(), obs.queries.end(),
                             [](const QueryObservation& q) { return q.failed; });
  }
  if (run.collisions < allowed && !run.steps.empty()) {
    // Fewer collisions than the scenario expects: known only at the end, so
    // the last step carries it.
    auto& last = run.steps.back();
    last.failed = true;
    last.expectation_failed = true;
    last.expectation_detail = "expected " + std::to_string(allowed) + " collisions in all, observed " +
                              std::to_string(run.collisions);
    fail(last.expectation_detail);
  } else if (run.collisions < allowed) {
    fail("expected " + std::to_string(allowed) + " collisions, observed " + std::to_string(run.collisions));
  }
  run.queries_not_output_checked = not_output_checked;
  run.first_failing_step = -1;
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    if (run.steps[i].failed) {
      run.first_failing_step = static_cast<std::int64_t>(i);
      break;
    }
  }
  // The one verdict: failed exactly when a step failed (a run with no steps
  // at all that expected collisions is the single exception, kept failed).
  if (run.first_failing_step >= 0) KVCHECK_ASSERT(!run.passed);
  if (run.first_failing_step < 0 && !run.steps.empty()) KVCHECK_ASSERT(run.passed);
}

}  // namespace kvcheck::properties
