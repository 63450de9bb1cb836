// Randomized multi-request schedules (swarm testing). Each case draws, from
// its own seed, which step kinds are on and their weights (some zero), a
// small cache configuration, and a schedule over one pool shared by several
// requests: prefill in both orders and any chunk size, decode, verify(k) with
// accept(a), finish and state reuse, reset, on one or two layers. The ring is
// sized safely for the drawn bounds (SPEC §5) plus a little random slack, so
// the correct implementation passes every case and each named fault fails
// some. Sizes keep a case to milliseconds at the reference's default precision.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// Coverage classes a check run must reach (RC_CLASSIFY / CODE_PROBE style).
struct Coverage {
  bool ring_wrap = false;            ///< some write lands at position >= S (the ring wrapped)
  bool verify_rejection = false;     ///< an accept keeps fewer drafts than the verify wrote
  bool chunk_longer_than_window = false;  ///< a prefill chunk has more rows than the window
  bool state_reuse = false;          ///< a request starts on a state id another request freed
};

/// Names of the coverage classes, in Coverage field order.
std::vector<std::string> coverage_names();
/// The classes as booleans, in coverage_names() order.
std::vector<bool> coverage_flags(const Coverage& c);

/// Draws one scenario from `seed` (deterministic on every platform), using
/// only what `caps` supports. With every capability on (the default) the
/// draw is the same as it always was, so seeds keep their cases.
scenarios::Scenario generate_scenario(std::uint64_t seed, const engines::Capabilities& caps = {});

/// Which coverage classes a cache with `caps` can reach at all (a class it
/// cannot reach, e.g. ring wrap for a cache without a sliding window, is not gated).
std::vector<bool> reachable_coverage(const engines::Capabilities& caps);

/// Which coverage classes a scenario reaches (computed from its schedule).
Coverage classify(const scenarios::Scenario& scenario);

}  // namespace kvcheck::properties
