// Refusal probes: calls a correct cache must refuse, leaving it unchanged.
// The runner (properties/runner.cpp) sends one per step and layer, rotating
// through those that apply.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "scenarios/scenario.hpp"
#include "scenarios/step_semantics.hpp"

namespace kvcheck::properties {

/// "code: detail" of a cache's refusal, as reports print it.
std::string refusal_text(const engines::Refusal& r);

/// The generic probes are ordinary calls in a state where they are invalid;
/// the others are the cache's own (CacheUnderTest::probe).
struct Prober {
  const engines::Capabilities& caps;
  engines::CacheUnderTest& cache;
  std::int64_t sent = 0;

  /// The probes that apply before `step` of a request in `progress`.
  /// (The request has begun: the runner sends begin before any probe.)
  std::vector<std::string> applicable(const scenarios::Step& step,
                                      const scenarios::RequestProgress& progress) const;

  /// Which of `apply` (non-empty) to send before step `step_index`: they
  /// rotate with the step index, except that right after a reset of the
  /// request the stale-revision probe goes first where it applies (docs/semantics.md "Golden values":
  /// a revision mismatch is refused also after reset).
  std::string choose(const std::vector<std::string>& apply, std::int64_t step_index, bool after_reset) const;

  /// Sends probe `name`; returns an empty string when it was refused and the
  /// cache is unchanged, else what went wrong. `k`: the step's keys.
  std::string run(const std::string& name, engines::StepCall call, const scenarios::RequestProgress& progress,
                  const std::vector<double>& k);
};

}  // namespace kvcheck::properties
