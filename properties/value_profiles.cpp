#include "properties/value_profiles.hpp"

#include <cmath>

#include "properties/position_code.hpp"

namespace kvcheck::properties {

void draw_profile_row(scenarios::ValueProfile profile, const scenarios::CacheConfig& c, std::int64_t position,
                      Prng& rng, std::vector<double>& k, std::vector<double>& v, std::vector<double>& q) {
  const std::int64_t kv_width = static_cast<std::int64_t>(c.kv_heads) * c.head_dim;
  const std::int64_t q_width = static_cast<std::int64_t>(c.q_heads) * c.head_dim;
  const std::size_t k0 = k.size(), v0 = v.size(), q0 = q.size();
  // The uniform draw first, in the order rows have always been drawn, so a
  // uniform scenario's rows are unchanged and the others are scaled copies.
  for (std::int64_t e = 0; e < kv_width; ++e) k.push_back(rng.signed_unit());
  if (!c.shared_row) {
    for (std::int64_t e = 0; e < kv_width; ++e) v.push_back(rng.signed_unit());
  }
  for (std::int64_t e = 0; e < q_width; ++e) q.push_back(rng.signed_unit());
  switch (profile) {
    case scenarios::ValueProfile::kUniform:
    case scenarios::ValueProfile::kPositionCode: return;  // coded rows: properties/position_code.hpp
    case scenarios::ValueProfile::kLargeLogits: {
      // Logit std ~ 48^2 * (1..2) / 3 * (1..2): ~1e3. The position factor is
      // 1 + (p mod 97) / 97, so peaks come and go along a long window.
      // With a shared row the key is also the value: left unscaled there.
      if (c.shared_row) return;
      const double key_scale = 48.0 * (1.0 + static_cast<double>(position % 97) / 97.0);
      for (std::size_t i = k0; i < k.size(); ++i) k[i] *= key_scale;
      for (std::size_t i = q0; i < q.size(); ++i) q[i] *= 48.0;
      return;
    }
    case scenarios::ValueProfile::kFp8Outliers: {
      const double row_scale = position % 4 == 3 ? 256.0 : 1.0;
      auto outliers = [&](std::vector<double>& x, std::size_t first) {
        const auto n = static_cast<std::int64_t>(x.size() - first);
        for (std::int64_t b0 = 0; b0 < n; b0 += 32) {
          const std::int64_t len = std::min<std::int64_t>(32, n - b0);
          const std::int64_t at = b0 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(len)));
          x[first + static_cast<std::size_t>(at)] *= 1024.0;
        }
        for (std::size_t i = first; i < x.size(); ++i) x[i] *= row_scale;
      };
      outliers(k, k0);
      if (!c.shared_row) outliers(v, v0);
      return;
    }
  }
}

scenarios::ValueProfile draw_value_profile(const scenarios::CacheConfig& cache, Prng& rng) {
  const std::uint64_t roll = rng.below(8);
  if (roll == 0) return scenarios::ValueProfile::kLargeLogits;
  if (roll == 1 && cache.format == scenarios::Format::kFp8) return scenarios::ValueProfile::kFp8Outliers;
  return scenarios::ValueProfile::kUniform;
}

scenarios::ValueProfile draw_value_profile(const scenarios::CacheConfig& cache, bool outputs_only,
                                           Prng& rng) {
  if (outputs_only && rng.chance(1, 2) && position_code_layout(cache).classes > 0) {
    return scenarios::ValueProfile::kPositionCode;
  }
  return draw_value_profile(cache, rng);
}

}  // namespace kvcheck::properties
