// Property: the incremental (cached) path equals the full-prefix path within
// 1e-25 relative at the default precision, over random sizes, windows,
// conventions, head layouts and RoPE settings.
#include <rapidcheck.h>
#include <catch2/catch.hpp>

#include "model/paths.hpp"
#include "support/prng.hpp"

using namespace kvcheck::model;

TEST_CASE("Paths: incremental equals full prefix within 1e-25 relative") {
  const bool holds = rc::check([](std::uint64_t seed) {
    kvcheck::Prng rng(seed);
    const std::int64_t n = rng.range(1, 9);
    const std::int32_t kv_heads = static_cast<std::int32_t>(rng.range(1, 2));
    const bool shared = kv_heads == 1 && rng.chance(1, 3);
    const std::int32_t group = static_cast<std::int32_t>(rng.range(1, 3));
    const std::int32_t head_dim = static_cast<std::int32_t>(2 * rng.range(1, 3));
    const Heads heads{kv_heads * group, kv_heads, head_dim, shared};
    Window window;
    if (rng.chance(3, 4)) {
      window.parameter = rng.range(1, 6);
      window.convention = static_cast<WindowConvention>(rng.below(3));
    }
    Rope rope;
    rope.style = static_cast<RopeStyle>(rng.below(3));
    rope.rotary_dims = static_cast<std::int32_t>(2 * rng.range(0, head_dim / 2));
    rope.base = rng.chance(1, 2) ? 10000.0 : 500000.0;
    const std::optional<Real> sink =
        rng.chance(1, 4) ? std::optional<Real>(Real(rng.signed_unit())) : std::nullopt;
    RC_TAG(shared ? "shared" : (group > 1 ? "gqa" : "mha"));
    RC_TAG(window.parameter ? "window" : "causal");

    const std::uint64_t data_seed = rng.next();
    const Projector<Real> project = [&](std::int64_t p) {
      kvcheck::Prng row_rng(kvcheck::mix_seed(data_seed, static_cast<std::uint64_t>(p)));
      auto draw = [&](std::int32_t count) {
        Row<Real> r;
        for (std::int32_t i = 0; i < count; ++i) r.emplace_back(row_rng.signed_unit() * 3);
        return r;
      };
      Projected<Real> row;
      row.q = draw(heads.q_heads * head_dim);
      row.k = draw(kv_heads * head_dim);
      if (!shared) row.v = draw(kv_heads * head_dim);
      for (std::int32_t h = 0; h < heads.q_heads; ++h) {
        Row<Real> slice = head_slice(row.q, h, head_dim);
        rope_rotate(slice, p, rope);
        std::copy(slice.begin(), slice.end(), row.q.begin() + h * head_dim);
      }
      for (std::int32_t h = 0; h < kv_heads; ++h) {
        Row<Real> slice = head_slice(row.k, h, head_dim);
        rope_rotate(slice, p, rope);
        std::copy(slice.begin(), slice.end(), row.k.begin() + h * head_dim);
      }
      return row;
    };
    const Real scale = 1 / sqrt(Real(head_dim));
    const auto full = full_prefix_path<Real>(n, project, heads, window, scale, sink);
    const auto inc = incremental_path<Real>(n, project, heads, window, scale, sink);
    RC_ASSERT(inc.counts.projected_rows == n);
    RC_ASSERT(full.counts.projected_rows == n * (n + 1) / 2);
    std::int64_t expected_pairs = 0;
    for (std::int64_t p = 0; p < n; ++p) expected_pairs += visible_range(p, window).count();
    RC_ASSERT(inc.counts.pairs == expected_pairs);
    for (std::size_t t = 0; t < full.outputs.size(); ++t) {
      const Row<Real>& a = inc.outputs[t].back();
      const Row<Real>& b = full.outputs[t].back();
      for (std::size_t d = 0; d < a.size(); ++d) {
        const Real bound = Real("1e-25") * std::max(Real(1), Real(abs(b[d])));
        RC_ASSERT(abs(a[d] - b[d]) <= bound);
      }
    }
  });
  CHECK(holds);  // rc::check reports to stdout only: its verdict is asserted here
}
