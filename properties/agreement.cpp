#include "properties/agreement.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <numeric>
#include <type_traits>
#include <utility>

#include "model/encoding.hpp"
#include "properties/stored_rows.hpp"

namespace kvcheck::properties {

namespace {

// (request, position) by lineage (docs/semantics.md "Row lineage"): the request whose step wrote the content; sorted
using Held = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// "r0 p3..5, r1 p7": consecutive positions of a request as one range, the
/// first `limit` ranges, then how many more.
std::string positions_text(const Held& held, std::size_t limit = 8) {
  std::string out;
  std::size_t ranges = 0, more = 0;
  for (std::size_t i = 0; i < held.size();) {
    std::size_t j = i;
    while (j + 1 < held.size() && held[j + 1].first == held[i].first && held[j + 1].second <= held[j].second + 1)
      ++j;
    if (ranges < limit) {
      if (!out.empty()) out += ", ";
      out += "r" + std::to_string(held[i].first) + " p" + std::to_string(held[i].second);
      if (held[j].second != held[i].second) out += ".." + std::to_string(held[j].second);
    } else {
      ++more;
    }
    ++ranges;
    i = j + 1;
  }
  if (more > 0) out += ", ... (" + std::to_string(more) + " more ranges)";
  return out.empty() ? "nothing" : out;
}

/// Of sorted `x`, what sorted `y` does not hold (as multisets).
Held minus(const Held& x, const Held& y) {
  Held out;
  std::set_difference(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(out));
  return out;
}

/// "A holds r0 p3 that B does not; B holds r0 p9 that A does not".
std::string sides_text(const Held& a, const Held& b, const std::string& verb) {
  const Held only_a = minus(a, b), only_b = minus(b, a);
  std::string out;
  if (!only_a.empty()) out += "A " + verb + " " + positions_text(only_a) + " that B does not";
  if (!only_b.empty()) out += std::string(out.empty() ? "" : "; ") + "B " + verb + " " + positions_text(only_b) + " that A does not";
  return out;
}

/// The rows a query read by lineage (docs/semantics.md "Row lineage"): a
/// prefix row read where the cache stored it again is its source's row.
Held read_positions(const QueryObservation& q) {
  Held out;
  for (const ReadTag& t : q.reads) {
    if (t.request >= 0) out.emplace_back(t.lineage(), t.position);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Whether a run's queries carry the positions they read (the cache reports
/// read slots, or they were decoded from position-coded outputs).
bool reads_known(const RunObservation& run) {
  return run.observed.rfind("slots+outputs", 0) == 0 || run.observed.find("position-code") != std::string::npos;
}

/// How --bitwise compares two runs' outputs (docs/semantics.md "Output
/// formats"): in the narrower of the output formats the two caches declare,
/// the side that declared it as answered, the other rounded once (to nearest,
/// ties to even) into it. Same formats, or none declared: both as answered.
struct BitwiseFormat {
  OutputFormat format = OutputFormat::kAccumulation;  ///< kAccumulation: as answered
  bool round_a = false, round_b = false;
};

OutputFormat declared_output_format(const RunObservation& run) {
  OutputFormat f = OutputFormat::kAccumulation;
  if (!run.output_format.empty()) parse_output_format(run.output_format, &f);
  return f;
}

BitwiseFormat bitwise_format(const RunObservation& a, const RunObservation& b) {
  const OutputFormat fa = declared_output_format(a), fb = declared_output_format(b);
  BitwiseFormat out;
  if (fa == fb) return out;
  // An undeclared side (outputs as accumulated) is the wider one.
  const double ua = output_format_unit_roundoff(fa), ub = output_format_unit_roundoff(fb);
  out.format = ua >= ub ? fa : fb;
  out.round_a = out.format != fa;
  out.round_b = out.format != fb;
  return out;
}

/// The outputs of one query on both sides: "" when they agree.
std::string outputs_difference(const QueryObservation& qa, const QueryObservation& qb, bool bitwise,
                               const BitwiseFormat& in) {
  const std::size_t n = qa.out.size();
  std::size_t differing = 0, first = n;
  double largest = 0;
  bool non_finite = false;
  // Under --bitwise the side with the wider output format is rounded once into the narrower.
  const auto side = [&](const QueryObservation& q, bool round, std::size_t d) {
    return bitwise && round ? model::round_output(in.format, q.out[d]) : q.out[d];
  };
  for (std::size_t d = 0; d < n; ++d) {
    const double x = side(qa, in.round_a, d), y = side(qb, in.round_b, d);
    const bool same_bits = std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y);
    if (same_bits) continue;
    if (!std::isfinite(x) || !std::isfinite(y)) {
      non_finite = true;
    } else {
      largest = std::max(largest, std::fabs(x - y));
    }
    ++differing;
    if (first == n) first = d;
  }
  if (differing == 0) return "";
  const std::string where = " (" + std::to_string(differing) + " of " + std::to_string(n) +
                            " elements differ, the first at " + std::to_string(first) + ": A " +
                            exact_text(qa.out[first]) + ", B " + exact_text(qb.out[first]) + ")";
  if (bitwise && in.format != OutputFormat::kAccumulation) {
    const std::string f(output_format_name(in.format));
    return "not bitwise equal in " + f + " (" + (in.round_a ? "A" : "B") + " rounded once into it: A " +
           exact_text(side(qa, in.round_a, first)) + ", B " + exact_text(side(qb, in.round_b, first)) +
           " at element " + std::to_string(first) + "), max |A - B| " + exact_text(largest) + where;
  }
  if (bitwise) return "not bitwise equal, max |A - B| " + exact_text(largest) + where;
  const double tolerance = std::max(qa.tolerance, qb.tolerance);
  if (!non_finite && largest <= tolerance) return "";
  return "max |A - B| " + (non_finite ? std::string("non-finite") : exact_text(largest)) +
         " beyond the larger tolerance " + exact_text(tolerance) + where;
}

/// How a run that did not run its scenario ended at open: "" when it ran.
std::string open_outcome(const RunObservation& run) {
  if (run.skipped) return run.skip_reason;
  if (run.crashed && run.steps.empty()) return run.first_failure;
  return "";
}

}  // namespace

std::string difference_text(const StepDifference& d) {
  if (d.step < 0) return "open: " + d.what + ": " + d.detail;
  return "step " + std::to_string(d.step) + " (" + d.kind + ") layer " + std::to_string(d.layer) + " request " +
         std::to_string(d.request) + ": " + d.what + ": " + d.detail;
}

PairComparison compare_runs(const RunObservation& a, const RunObservation& b, bool bitwise, bool resident) {
  PairComparison cmp;
  const std::string open_a = open_outcome(a), open_b = open_outcome(b);
  if (!open_a.empty() || !open_b.empty()) {
    const bool excluded_a = a.skipped && !a.refused, excluded_b = b.skipped && !b.refused;
    if (excluded_a || excluded_b || (a.refused && b.refused)) {
      cmp.skipped = true;
      cmp.refused = a.refused && b.refused;
      cmp.skip_reason = excluded_a ? "A: " + a.skip_reason : (excluded_b ? "B: " + b.skip_reason : "A: " + a.skip_reason + "; B: " + b.skip_reason);
      return cmp;
    }
    // One side ran what the other refused (or crashed at open): shown, never agreement.
    StepDifference d;
    d.kind = "open";
    d.what = "refusal";
    d.detail = open_a.empty() ? "A ran the case; B did not: " + open_b
                              : (open_b.empty() ? "B ran the case; A did not: " + open_a
                                                : "A did not run it: " + open_a + "; B did not: " + open_b);
    cmp.differences.push_back(std::move(d));
    cmp.counts.both_stopped = !open_a.empty() && !open_b.empty() ? 1 : 0;
    return cmp;
  }
  ComparedCounts& n = cmp.counts;
  n.cases = 1;
  const BitwiseFormat in = bitwise_format(a, b);
  if (bitwise && in.format != OutputFormat::kAccumulation) n.bitwise_format = output_format_name(in.format);
  const bool reads = reads_known(a) && reads_known(b);
  const std::size_t steps = std::max(a.steps.size(), b.steps.size());
  for (std::size_t i = 0; i < steps; ++i) {
    if (i >= a.steps.size() || i >= b.steps.size()) {
      // One run ended earlier (a refusal or crash already shown, or a probe it got wrong).
      const bool a_ended = i >= a.steps.size();
      const StepObservation& s = a_ended ? b.steps[i] : a.steps[i];
      const RunObservation& ended = a_ended ? a : b;
      cmp.differences.push_back({s.step, s.layer, s.kind, s.request, "stopped",
                                 std::string(a_ended ? "A" : "B") + "'s run ended before this step (" +
                                     ended.first_failure + "); " + (a_ended ? "B" : "A") + " ran it"});
      break;
    }
    const StepObservation& sa = a.steps[i];
    const StepObservation& sb = b.steps[i];
    auto differs = [&](const std::string& what, const std::string& detail) {
      cmp.differences.push_back({sa.step, sa.layer, sa.kind, sa.request, what, detail});
    };
    if (!sa.error.empty() || !sb.error.empty()) {
      // One refused (or crashed): a difference. Both did: each cache's own
      // failure, which plain check fails too; two caches failing alike are
      // not in agreement (the runs end here).
      if (sa.error.empty() != sb.error.empty()) {
        differs("refusal", sa.error.empty() ? "B: " + sb.error + "; A ran it" : "A: " + sa.error + "; B ran it");
      } else {
        differs("both-stopped", "A: " + sa.error + "; B: " + sb.error);
        n.both_stopped = 1;
      }
      continue;
    }
    ++n.steps;
    const std::size_t queries = std::min(sa.queries.size(), sb.queries.size());
    n.queries += static_cast<std::int64_t>(queries);
    std::string reads_found, outputs_found;
    for (std::size_t k = 0; k < queries; ++k) {
      const QueryObservation& qa = sa.queries[k];
      const QueryObservation& qb = sb.queries[k];
      if (reads) {
        ++n.reads;
        const Held ra = read_positions(qa), rb = read_positions(qb);
        if (reads_found.empty() && ra != rb)
          reads_found = "query at position " + std::to_string(qa.position) + ": " + sides_text(ra, rb, "read");
      }
      if (!qa.out.empty() && qa.out.size() == qb.out.size()) {
        ++n.outputs;
        if (outputs_found.empty()) {
          const std::string o = outputs_difference(qa, qb, bitwise, in);
          if (!o.empty()) outputs_found = "query at position " + std::to_string(qa.position) + ": " + o;
        }
      }
    }
    if (resident) ++n.resident;
    // Rows by lineage (docs/semantics.md "Row lineage"): a cache that shares a
    // prefix row and one that stores it again hold the same row.
    if (resident && sa.resident != sb.resident)
      differs("resident", "by lineage, " + sides_text(sa.resident, sb.resident, "holds"));
    if (!reads_found.empty()) differs("reads", reads_found);
    if (!outputs_found.empty()) differs("outputs", outputs_found);
  }
  return cmp;
}

engines::Capabilities intersect_capabilities(const engines::Capabilities& a, const engines::Capabilities& b) {
  engines::Capabilities c = a;
  c.name = a.name + " & " + b.name;
#define KVCHECK_INTERSECT_STEP(id, member, kind, order) c.member = a.member && b.member;
  KVCHECK_STEP_CAPABILITIES(KVCHECK_INTERSECT_STEP)
#undef KVCHECK_INTERSECT_STEP
  const auto both = [](const auto& x, const auto& y) {
    std::decay_t<decltype(x)> out;
    for (const auto& v : x) {
      if (std::find(y.begin(), y.end(), v) != y.end()) out.push_back(v);
    }
    return out;
  };
  c.formats = both(a.formats, b.formats);
  c.rope_styles = both(a.rope_styles, b.rope_styles);
  using C = engines::Capabilities;
  // What the cache supports or reports: both must.
  for (bool C::*m :
       {&C::gqa, &C::shared_row, &C::sink, &C::softmax_scale, &C::partial_rope, &C::computes_outputs,
        &C::reports_written_slots, &C::reports_read_slots, &C::ring_addressing, &C::per_layer_windows,
        &C::prefix_sharing, &C::reports_frees, &C::reports_cached}) {
    c.*m = a.*m && b.*m;
  }
  c.full_window_only = a.full_window_only || b.full_window_only;
  const auto sizes = [](const engines::SizeSet& x, const engines::SizeSet& y) {
    engines::SizeSet s;
    s.min = std::max(x.min, y.min);
    s.max = x.max == 0 ? y.max : (y.max == 0 ? x.max : std::min(x.max, y.max));
    s.multiple_of = std::lcm(std::max<std::int64_t>(x.multiple_of, 1), std::max<std::int64_t>(y.multiple_of, 1));
    const auto listed = x.values.empty() ? y.values : x.values;
    for (const std::int64_t v : listed) {
      if (x.contains(v) && y.contains(v)) s.values.push_back(v);
    }
    if (s.values.empty() && (!x.values.empty() || !y.values.empty())) {
      s.min = 2;  // nothing in common: no size is in [2, 1]
      s.max = 1;
    }
    return s;
  };
  c.head_dims = sizes(a.head_dims, b.head_dims);
  c.rotary_dims = sizes(a.rotary_dims, b.rotary_dims);
  // Limits (0: none): the lower one.
  for (std::int64_t C::*m : {&C::max_states, &C::max_layers, &C::max_step_rows, &C::max_heads, &C::max_kv_heads,
                             &C::max_window_keys, &C::max_positions}) {
    c.*m = a.*m == 0 ? b.*m : (b.*m == 0 ? a.*m : std::min(a.*m, b.*m));
  }
  if (a.fast_kernel_runs && b.fast_kernel_runs) {
    c.fast_kernel_runs = [fa = a.fast_kernel_runs, fb = b.fast_kernel_runs](const engines::CacheSpec& spec) {
      return fa(spec) || fb(spec);
    };
  } else if (!a.fast_kernel_runs) {
    c.fast_kernel_runs = b.fast_kernel_runs;
  }
  // Kernel paths: the first cache's, then the second's, each by its own dispatch.
  c.kernel_paths = a.kernel_paths;
  c.kernel_paths.insert(c.kernel_paths.end(), b.kernel_paths.begin(), b.kernel_paths.end());
  if (!c.kernel_paths.empty()) {
    c.kernel_paths_run = [fa = a.kernel_paths_run, na = a.kernel_paths.size(), fb = b.kernel_paths_run,
                          nb = b.kernel_paths.size()](const engines::CacheSpec& spec,
                                                      std::span<const std::int64_t> queries) {
      std::vector<bool> reached = fa ? fa(spec, queries) : std::vector<bool>{};
      reached.resize(na, false);
      std::vector<bool> second = fb ? fb(spec, queries) : std::vector<bool>{};
      second.resize(nb, false);
      reached.insert(reached.end(), second.begin(), second.end());
      return reached;
    };
  }
  return c;
}

bool resident_sets_comparable(const engines::Capabilities& a, const engines::Capabilities& b) noexcept {
  if (a.reports_frees && b.reports_frees) return true;
  if (a.reports_frees || b.reports_frees) return false;
  // Cases a full-window cache runs never write a slot twice: both hold every row written.
  return a.full_window_only || b.full_window_only ||
         (a.ring_addressing == b.ring_addressing && a.block_size == b.block_size);
}

bool runs_side_by_side(const RunOptions& run) noexcept { return !run.against.empty() || run.repeat_bitwise; }

RunOptions second_run(const RunOptions& first) {
  RunOptions second = first;
  second.provider = nullptr;
  if (!first.against.empty()) {
    second.backend = first.against;
    second.fault = "none";
  }
  second.against.clear();
  second.repeat_bitwise = false;
  return second;
}

std::string side_by_side_property(const RunOptions& run) {
  return run.against.empty() ? "repeat-bitwise" : "agreement";
}

PairRun run_pair(const scenarios::Scenario& scenario, const RunOptions& options, engines::CacheProvider& a,
                 engines::CacheProvider& b) {
  PairRun pair;
  RunOptions first = options;
  first.record_reads = true;
  first.record_outputs = true;
  first.record_resident = true;
  first.provider = &a;
  RunOptions second = second_run(first);
  second.provider = &b;
  pair.a = run_scenario(scenario, first);
  pair.b = run_scenario(scenario, second);
  const bool bitwise = options.bitwise || (options.repeat_bitwise && options.against.empty());
  pair.comparison = compare_runs(pair.a, pair.b, bitwise, resident_sets_comparable(a.capabilities(), b.capabilities()));
  RunObservation& s = pair.summary;
  s.scenario_name = scenario.name;
  s.backend = options.backend;
  s.fault = options.fault;
  s.skipped = pair.comparison.skipped;
  s.refused = pair.comparison.refused;
  s.skip_reason = pair.comparison.skip_reason;
  s.queries = pair.comparison.counts.queries;
  s.queries_not_output_checked = pair.comparison.counts.queries - pair.comparison.counts.outputs;
  s.passed = !pair.comparison.differ();
  if (!s.passed) {
    s.first_failing_step = 0;
    s.first_failure = difference_text(pair.comparison.differences.front());
  }
  return pair;
}

}  // namespace kvcheck::properties
