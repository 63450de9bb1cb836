// `kvcheck check`: many generated cases on both cores, coverage gates, and a
// shrunk counterexample for the first failure. The cases are split by index
// between worker threads and their results merged in case order, so the
// outcome (and every report) depends only on the seed, never on timing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "properties/generator.hpp"
#include "properties/observation.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// Options of one check run.
struct CheckOptions {
  std::int64_t cases = 200;
  std::uint64_t seed = 1;
  RunOptions run;
  int threads = 2;
  /// Makes the cache providers instead of make_provider(run) when set: one
  /// for the coordinating thread (capabilities, shrinking) and one per
  /// worker, so a C++ engine's caches are never shared between threads.
  /// Workers call it from their own threads, possibly at the same time.
  /// `run.provider` is ignored by run_check either way.
  std::function<std::unique_ptr<engines::CacheProvider>()> provider_factory;
  /// Called from the coordinating thread with cases finished so far.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
};

/// Result of a check run.
struct CheckResult {
  std::int64_t cases = 0;
  std::int64_t failures = 0;
  std::vector<std::int64_t> coverage_counts;  ///< per coverage_names() entry
  std::vector<bool> reachable;                ///< per entry: whether the cache can reach it at all (gated)
  bool coverage_ok = true;                    ///< every reachable class reached at least once
  std::int64_t skipped = 0;                   ///< cases the cache refused to open
  bool found_failure = false;
  std::uint64_t failing_case_seed = 0;        ///< seed of the first failing case
  scenarios::Scenario original;               ///< the first failing case as drawn
  scenarios::Scenario shrunk;                 ///< its shrunk counterexample
  RunObservation shrunk_run;                  ///< observation of the shrunk case
  std::int64_t shrink_runs = 0;               ///< scenarios run while shrinking
};

/// `text` quoted for a POSIX shell when it needs it.
std::string shell_quote(const std::string& text);
/// "--impl NAME [--fault F]" that selects the same cache (quoted for a shell).
std::string replay_arguments(const RunOptions& run);

/// Seed of case `index` of a check run with `seed`.
std::uint64_t case_seed(std::uint64_t seed, std::int64_t index);

/// Runs the cases; on failure shrinks the first failing case (lowest index).
CheckResult run_check(const CheckOptions& options);

/// Greedy shrinking: repeatedly tries smaller variants (fewer requests,
/// fewer steps, shorter chunks, fewer drafts, one layer, fewer heads,
/// narrower heads, f64 rows, no RoPE, no sink) and keeps any that still
/// fails, until none does. `fails` must be deterministic.
scenarios::Scenario shrink_scenario(const scenarios::Scenario& failing,
                                    const std::function<bool(const scenarios::Scenario&)>& fails,
                                    std::int64_t* runs);

}  // namespace kvcheck::properties
