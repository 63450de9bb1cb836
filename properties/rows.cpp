#include "properties/rows.hpp"

#include "properties/position_code.hpp"
#include "properties/value_profiles.hpp"
#include "support/prng.hpp"

namespace kvcheck::properties {

RowSet make_rows(const scenarios::Scenario& sc, std::int32_t layer, std::int64_t request, std::int64_t first,
                 std::int64_t n, std::int64_t step_index) {
  const auto& c = sc.cache;
  const std::int64_t kv_width = static_cast<std::int64_t>(c.kv_heads) * c.head_dim;
  const std::int64_t q_width = static_cast<std::int64_t>(c.q_heads) * c.head_dim;
  RowSet rows;
  const bool coded = sc.data.profile == scenarios::ValueProfile::kPositionCode;
  const PositionCodeLayout layout = coded ? position_code_layout(c) : PositionCodeLayout{};
  rows.k.reserve(static_cast<std::size_t>(n * kv_width));
  if (!c.shared_row) rows.v.reserve(static_cast<std::size_t>(n * kv_width));
  rows.q.reserve(static_cast<std::size_t>(n * q_width));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t p = first + i;
    // A row for this very step first, else one for any step, else the PRNG.
    const scenarios::ExplicitRow* given = nullptr;
    for (const auto& r : sc.data.rows) {
      if (r.layer != layer || r.request != request || r.position != p) continue;
      if (r.step == step_index) {
        given = &r;
        break;
      }
      if (!r.step) given = &r;
    }
    if (given) {
      rows.k.insert(rows.k.end(), given->k.begin(), given->k.end());
      if (!c.shared_row) rows.v.insert(rows.v.end(), given->v.begin(), given->v.end());
      rows.q.insert(rows.q.end(), given->q.begin(), given->q.end());
      continue;
    }
    std::uint64_t s = mix_seed(sc.data.seed, static_cast<std::uint64_t>(layer));
    s = mix_seed(s, static_cast<std::uint64_t>(request));
    s = mix_seed(s, static_cast<std::uint64_t>(p));
    Prng rng(mix_seed(s, static_cast<std::uint64_t>(step_index)));
    if (coded) {
      position_code_row(c, layout, layer, request, p, step_index, rng, rows.k, rows.v, rows.q);
    } else {
      draw_profile_row(sc.data.profile, c, p, rng, rows.k, rows.v, rows.q);
    }
  }
  return rows;
}

}  // namespace kvcheck::properties
