#include "sweep/layer_minima.hpp"

#include <algorithm>

#include "scenarios/step_semantics.hpp"
#include "support/error.hpp"

namespace kvcheck::sweep {

namespace {

/// Safe capacity of one sliding window of `keys` for the scenario's steps
/// (docs/semantics.md, Safe capacity): W for a decode, W + k for verify(k),
/// W + C - 1 for a store_then_load chunk of C, max(W, C) for a
/// load_then_store chunk.
std::int64_t sliding_bound(std::int64_t keys, const std::vector<scenarios::Step>& steps) {
  std::int64_t bound = keys;
  for (const scenarios::Step& s : steps) {
    if (s.kind == scenarios::StepKind::kVerify) bound = std::max(bound, keys + s.drafts);
    if (s.kind == scenarios::StepKind::kPrefill) {
      bound = std::max(bound, s.order == scenarios::Order::kStoreThenLoad ? keys + s.rows - 1 : s.rows);
    }
  }
  return bound;
}

}  // namespace

LayerMinima layer_minima(const scenarios::Scenario& scenario, const properties::RunOptions& options) {
  const scenarios::CacheConfig& c = scenario.cache;
  if (c.layer_windows.empty()) {
    throw Error(ErrorId::kUsage, "--layers-of",
                "scenario '" + scenario.name + "' gives no layer its own window (cache.layer_windows)");
  }
  LayerMinima m;
  m.scenario = scenario.name;
  // A global layer holds every position written (a request begun from a
  // shared prefix starts at the prefix's length).
  const std::int64_t end = scenarios::schedule_end(scenario.steps, scenario.requests);
  for (std::int32_t l = 0; l < c.layers; ++l) {
    if (c.layer_windows[static_cast<std::size_t>(l)].window) {
      m.sliding_layers.push_back(l);
      m.sliding_formula =
          std::max(m.sliding_formula, sliding_bound(scenarios::layer_window_keys(c, l), scenario.steps));
    } else {
      m.global_layers.push_back(l);
      m.global_formula = end;
    }
  }
  m.searched_to = 2 * std::max(m.sliding_formula, m.global_formula) + 2;
  // safe[class][S]: no layer of the class lost a row at capacity S.
  std::vector<bool> sliding_safe, global_safe;
  std::int64_t skipped = 0;
  std::string skip_reason;
  for (std::int64_t s = 1; s <= m.searched_to; ++s) {
    scenarios::Scenario sc = scenario;
    sc.cache.ring_rows = s;
    sc.expect.reset();  // the scenario's own expectations are for its own capacity
    const properties::RunObservation run = properties::run_scenario(sc, options);
    ++m.runs;
    if (run.skipped) {
      ++skipped;
      skip_reason = run.skip_reason;
    }
    bool sliding_lost = run.skipped, global_lost = run.skipped;
    bool any_layer_failed = false;
    for (const auto& step : run.steps) {
      bool lost = step.failed;
      for (const auto& q : step.queries) lost = lost || !q.overwritten.empty() || !q.missing.empty();
      if (!lost) continue;
      any_layer_failed = true;
      const bool global = !c.layer_windows[static_cast<std::size_t>(step.layer)].window;
      (global ? global_lost : sliding_lost) = true;
    }
    // A run that failed with no step to blame (a refusal or crash that
    // stopped it) is unsafe for both classes.
    if (!run.passed && !any_layer_failed) sliding_lost = global_lost = true;
    sliding_safe.push_back(!sliding_lost);
    global_safe.push_back(!global_lost);
  }
  // A cache that runs the scenario at no capacity has no minimum to find.
  if (skipped == m.runs) {
    throw Error(ErrorId::kUsage, "--layers-of",
                "the cache does not run scenario '" + scenario.name + "' at any capacity 1.." +
                    std::to_string(m.searched_to) + ": " + skip_reason);
  }
  // The smallest S from which on every capacity searched was safe.
  auto minimum = [&](const std::vector<bool>& safe, bool present) -> std::int64_t {
    if (!present) return 0;
    if (safe.empty() || !safe.back()) return -1;
    std::int64_t s = static_cast<std::int64_t>(safe.size());
    while (s > 1 && safe[static_cast<std::size_t>(s - 2)]) --s;
    return s;
  };
  m.sliding_min = minimum(sliding_safe, !m.sliding_layers.empty());
  m.global_min = minimum(global_safe, !m.global_layers.empty());
  return m;
}

std::string layer_minima_text(const LayerMinima& m) {
  auto layers = [](const std::vector<std::int32_t>& ls) {
    std::string out;
    for (const std::int32_t l : ls) out += (out.empty() ? "" : ",") + std::to_string(l);
    return out;
  };
  auto line = [&](const char* what, const std::vector<std::int32_t>& ls, std::int64_t min, std::int64_t formula) {
    std::string out = std::string(what) + " layers " + layers(ls) + ": ";
    if (ls.empty()) return out + "none\n";
    out += min < 0 ? "no safe capacity up to " + std::to_string(m.searched_to) : "min capacity " + std::to_string(min);
    out += ", formula " + std::to_string(formula) + ", agree " + (min == formula ? "yes" : "NO") + "\n";
    return out;
  };
  return "per-layer minima of " + m.scenario + " (capacities 1.." + std::to_string(m.searched_to) + ", " +
         std::to_string(m.runs) + " runs)\n" + line("sliding", m.sliding_layers, m.sliding_min, m.sliding_formula) +
         line("global", m.global_layers, m.global_min, m.global_formula);
}

}  // namespace kvcheck::sweep
