// Value profiles: how the rows of a scenario without explicit values are
// drawn from its seed (scenarios::ValueProfile, JSON data.profile), so the
// generator can reach the values where attention numerics break:
//   uniform       every element uniform in [-1, 1)
//   large-logits  q and k scaled by 48 and k by a further 1..2 that varies
//                 with the position: logits reach ~1e3 (exp overflows
//                 without max-subtraction: e^88 in float, e^709 in double)
//                 and the window's peak logit moves between blocks, so an
//                 online softmax must rescale what it summed so far
//   position-code q = 0 and values coding each row's position and write, for
//                 caches that report no slots (properties/position_code.hpp)
//   fp8-outliers  one element of every 32-element block scaled by 2^10 (the
//                 block scale follows the outlier, the others fall to fp8
//                 subnormals or zero), and every fourth position a whole row
//                 scaled by 2^8
// Values stay within [-1, 1) in every profile except fp8-outliers, so the
// output tolerance (which scales with the largest value) stays tight.
#pragma once

#include <cstdint>
#include <vector>

#include "scenarios/scenario.hpp"
#include "support/prng.hpp"

namespace kvcheck::properties {

/// Appends one position's k, v (unless shared) and q elements to the row
/// set, drawn from `rng` under `profile`.
void draw_profile_row(scenarios::ValueProfile profile, const scenarios::CacheConfig& cache,
                      std::int64_t position, Prng& rng, std::vector<double>& k, std::vector<double>& v,
                      std::vector<double>& q);

/// A profile for a generated case: uniform most of the time, each other
/// profile with probability 1/8 (fp8-outliers only for fp8 caches, where it
/// means something). For the generator (properties/generator.cpp).
scenarios::ValueProfile draw_value_profile(const scenarios::CacheConfig& cache, Prng& rng);

/// The same, for a cache that may report no read slots: when `outputs_only`,
/// half the cases (one roll of `rng` first) are `position-code`
/// (properties/position_code.hpp) where the configuration leaves room for
/// a code, so kvcheck sees from the outputs which rows were read; the other
/// half draw as above. A cache that reports its slots draws as above.
scenarios::ValueProfile draw_value_profile(const scenarios::CacheConfig& cache, bool outputs_only, Prng& rng);

}  // namespace kvcheck::properties
