// LayerKvCache (seed 000, docs/semantics.md "Golden values"): the three-append fixture against the
// printed values and the model's independent full-prefix pass, reset/replay,
// and the nine rejected calls, each leaving length and storage
// byte-identical.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "impl/cpu/layer_kv_cache.hpp"
#include "model/layer_fixture.hpp"

using namespace kvcheck::impl::cpu;
namespace model = kvcheck::model;

namespace {

std::vector<double> flat(const std::vector<model::Row<model::Real>>& w) {
  std::vector<double> out;
  for (const auto& row : w) {
    for (const auto& x : row) out.push_back(model::to_double(x));
  }
  return out;
}

// The fixture layer, built from the model's reconstruction (docs/semantics.md "Golden values").
AttentionLayer fixture_layer(const model::LayerModel<model::Real>& m, double base = 10000.0,
                             std::int64_t max_positions = 8) {
  return AttentionLayer(m.model_width, m.heads.q_heads, LayerRope{2, max_positions, base}, flat(m.wq),
                        flat(m.wk), flat(m.wv), flat(m.wo));
}

std::vector<double> input_row(const model::LayerModel<model::Real>& m, std::size_t t) {
  std::vector<double> x;
  for (const auto& v : m.inputs[t]) x.push_back(model::to_double(v));
  return x;
}

struct Snapshot {
  std::int64_t length;
  std::vector<double> keys, values;
  bool operator==(const Snapshot& o) const {
    return length == o.length && keys.size() == o.keys.size() && values.size() == o.values.size() &&
           std::memcmp(keys.data(), o.keys.data(), keys.size() * sizeof(double)) == 0 &&
           std::memcmp(values.data(), o.values.data(), values.size() * sizeof(double)) == 0;
  }
};

Snapshot snap(const LayerKvCache& c) {
  return {c.length(), {c.keys().begin(), c.keys().end()}, {c.values().begin(), c.values().end()}};
}

const std::int64_t kShape[3] = {1, 1, 4};

}  // namespace

TEST_CASE("LayerKvCache: seed fixture outputs match the printed rows and the full-prefix pass") {
  const auto m = model::seed_layer_fixture();
  const auto evidence = model::run_layer_fixture(m);
  AttentionLayer layer = fixture_layer(m);
  std::unique_ptr<LayerKvCache> cache;
  REQUIRE(LayerKvCache::create(layer, 1, 4, &cache) == LayerCacheError::kOk);
  const double printed[3][4] = {{1, 0, 1, 0},
                                {0.213809009, 0.786190991, 0.770151153, -0.420735492},
                                {0.629044078, 0.945303958, 0.374718490, -0.583589471}};
  for (std::size_t t = 0; t < 3; ++t) {
    const auto x = input_row(m, t);
    std::vector<double> out(4);
    REQUIRE(cache->append(layer, x, kShape, out) == LayerCacheError::kOk);
    CHECK(cache->length() == static_cast<std::int64_t>(t + 1));
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(std::fabs(out[i] - printed[t][i]) < 1e-9);
      CHECK(std::fabs(out[i] - evidence.steps[t].full_output[i]) < 1e-12);
    }
    // The appended rows: rotated key and unrotated value of every head, at
    // physical [0, h, t, :].
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t e = 0; e < 2; ++e) {
        const std::size_t at = (h * 4 + t) * 2 + e;
        CHECK(std::fabs(cache->keys()[at] - evidence.steps[t].keys[h][e]) < 1e-12);
        CHECK(std::fabs(cache->values()[at] - evidence.steps[t].values[h][e]) < 1e-12);
      }
    }
  }
}

TEST_CASE("LayerKvCache: reset keeps allocation and values, replay is identical") {
  const auto m = model::seed_layer_fixture();
  AttentionLayer layer = fixture_layer(m);
  std::unique_ptr<LayerKvCache> cache;
  REQUIRE(LayerKvCache::create(layer, 1, 4, &cache) == LayerCacheError::kOk);
  std::vector<std::vector<double>> first, second;
  for (std::size_t t = 0; t < 3; ++t) {
    std::vector<double> out(4);
    REQUIRE(cache->append(layer, input_row(m, t), kShape, out) == LayerCacheError::kOk);
    first.push_back(out);
  }
  const Snapshot before = snap(*cache);
  const double* keys_data = cache->keys().data();
  cache->reset();
  CHECK(cache->length() == 0);
  CHECK(cache->keys().data() == keys_data);  // same allocation
  CHECK(cache->keys().size() == before.keys.size());
  CHECK(std::memcmp(cache->keys().data(), before.keys.data(), before.keys.size() * 8) == 0);
  CHECK(std::memcmp(cache->values().data(), before.values.data(), before.values.size() * 8) == 0);
  for (std::size_t t = 0; t < 3; ++t) {
    std::vector<double> out(4);
    REQUIRE(cache->append(layer, input_row(m, t), kShape, out) == LayerCacheError::kOk);
    second.push_back(out);
  }
  CHECK(first == second);
  CHECK(snap(*cache) == before);
}

TEST_CASE("LayerKvCache: the seed's rejected calls change neither length nor storage") {
  const auto m = model::seed_layer_fixture();
  AttentionLayer layer = fixture_layer(m);
  std::unique_ptr<LayerKvCache> cache;
  REQUIRE(LayerKvCache::create(layer, 1, 4, &cache) == LayerCacheError::kOk);
  std::vector<double> out(4);
  REQUIRE(cache->append(layer, input_row(m, 0), kShape, out) == LayerCacheError::kOk);
  REQUIRE(cache->append(layer, input_row(m, 1), kShape, out) == LayerCacheError::kOk);
  const auto x = input_row(m, 2);
  auto refused = [&](const AttentionLayer& l, std::span<const double> in, std::span<const std::int64_t> shape,
                     LayerCacheError want, const char* what) {
    const Snapshot before = snap(*cache);
    std::vector<double> o(4, -7.0);
    const auto got = l.model_width() == 4 ? cache->append(l, in, shape, o)
                                          : cache->append(l, in, shape, std::span<double>(o.data(), 4));
    INFO(what << ": " << layer_cache_error_name(got));
    CHECK(got == want);
    CHECK(snap(*cache) == before);
    CHECK(o == std::vector<double>(4, -7.0));
  };
  SECTION("two-token input") {
    std::vector<double> two(8, 0.5);
    const std::int64_t shape[3] = {1, 2, 4};
    refused(layer, two, shape, LayerCacheError::kSingleTokenRequired, "two tokens");
  }
  SECTION("model-width mismatch (input and layer)") {
    std::vector<double> narrow(3, 0.5);
    const std::int64_t shape[3] = {1, 1, 3};
    refused(layer, narrow, shape, LayerCacheError::kInputWidthMismatch, "input width 3");
    std::vector<double> eye6(36, 0.0);
    for (int i = 0; i < 6; ++i) eye6[static_cast<std::size_t>(i * 7)] = 1.0;
    AttentionLayer wide(6, 2, LayerRope{2, 8, 10000.0}, eye6, eye6, eye6, eye6);
    std::vector<double> x6(6, 0.5);
    const std::int64_t shape6[3] = {1, 1, 6};
    const Snapshot before = snap(*cache);
    std::vector<double> o(6);
    CHECK(cache->append(wide, x6, shape6, o) == LayerCacheError::kModelWidthMismatch);
    CHECK(snap(*cache) == before);
  }
  SECTION("head mismatch") {
    AttentionLayer one_head(4, 1, LayerRope{2, 8, 10000.0}, flat(m.wq), flat(m.wk), flat(m.wv), flat(m.wo));
    refused(one_head, x, kShape, LayerCacheError::kHeadCountMismatch, "one head");
  }
  SECTION("rebuilt layer with the same shapes and values (identity mismatch)") {
    AttentionLayer rebuilt = fixture_layer(m);
    refused(rebuilt, x, kShape, LayerCacheError::kLayerMismatch, "rebuilt");
  }
  SECTION("changed RoPE base") {
    refused(layer.with_rope(LayerRope{2, 8, 500.0}), x, kShape, LayerCacheError::kRopeMismatch, "base");
  }
  SECTION("changed RoPE position capacity") {
    refused(layer.with_rope(LayerRope{2, 16, 10000.0}), x, kShape, LayerCacheError::kRopeMismatch,
            "max positions");
  }
  SECTION("finite input whose projection overflows") {
    std::vector<double> big = {1e308, 0, 1e308, 0};
    std::vector<double> doubled = flat(m.wk);
    for (auto& w : doubled) w *= 4;
    // A layer whose Wk scales by 4: 4e308 is not a double.
    AttentionLayer steep(4, 2, LayerRope{2, 8, 10000.0}, flat(m.wq), doubled, flat(m.wv), flat(m.wo));
    std::unique_ptr<LayerKvCache> c2;
    REQUIRE(LayerKvCache::create(steep, 1, 4, &c2) == LayerCacheError::kOk);
    std::vector<double> o(4);
    REQUIRE(c2->append(steep, input_row(m, 0), kShape, o) == LayerCacheError::kOk);
    const Snapshot before = snap(*c2);
    CHECK(c2->append(steep, big, kShape, o) == LayerCacheError::kNonFinite);
    CHECK(snap(*c2) == before);
    // Also through the fixture cache: finite input, overflowing scores.
    refused(layer, big, kShape, LayerCacheError::kNonFinite, "overflowing scores");
  }
  SECTION("full cache") {
    REQUIRE(cache->append(layer, x, kShape, out) == LayerCacheError::kOk);
    REQUIRE(cache->append(layer, x, kShape, out) == LayerCacheError::kOk);
    refused(layer, x, kShape, LayerCacheError::kFull, "full");
  }
  SECTION("parameters updated in place (revision mismatch), also after reset") {
    auto wv = flat(m.wv);
    wv[0] = 0.5;
    layer.update_parameter(2, wv);
    refused(layer, x, kShape, LayerCacheError::kRevisionMismatch, "revision");
    cache->reset();
    refused(layer, x, kShape, LayerCacheError::kRevisionMismatch, "revision after reset");
    // A new cache binds the updated layer.
    std::unique_ptr<LayerKvCache> fresh;
    REQUIRE(LayerKvCache::create(layer, 1, 4, &fresh) == LayerCacheError::kOk);
    CHECK(fresh->append(layer, x, kShape, out) == LayerCacheError::kOk);
  }
}

TEST_CASE("LayerKvCache: construction refuses zero and oversized configurations") {
  const auto m = model::seed_layer_fixture();
  AttentionLayer layer = fixture_layer(m, 10000.0, 4);
  std::unique_ptr<LayerKvCache> c;
  CHECK(LayerKvCache::create(layer, 0, 4, &c) == LayerCacheError::kZeroBatch);
  CHECK(LayerKvCache::create(layer, 1, 0, &c) == LayerCacheError::kZeroCapacity);
  CHECK(LayerKvCache::create(layer, 1, 5, &c) == LayerCacheError::kCapacityExceedsPositions);
  AttentionLayer huge_rope = layer.with_rope(LayerRope{2, std::int64_t{1} << 62, 10000.0});
  CHECK(LayerKvCache::create(huge_rope, std::int64_t{1} << 40, std::int64_t{1} << 40, &c) ==
        LayerCacheError::kElementCountOverflow);
  CHECK(c == nullptr);
}
