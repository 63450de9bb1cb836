// The CUDA backend against the CPU backend, kernel by kernel: both get the
// same calls, and every answer (stored rows, tags,
// duplicates, attention outputs, read tags and slots, refusals) must agree:
// exactly for integers and tags, and for rows and outputs within the bounds
// that follow from what differs between the two. Needs a device: without
// one, every case here reports itself skipped by name (cuda_skip_listener.cpp).
//
// What differs, and what equality that allows (u = 2^-53):
// * RoPE. The device's pow, sin and cos are within 2 ulp (CUDA C
//   Programming Guide, double-precision functions), glibc's within 1, and
//   the angle p*theta multiplies theta's error by the position. For a pair
//   (x, y) rotated at position p (theta <= 1), the two rotated values differ
//   by at most (|x| + |y|) * (7 + 5p) * u. Values and unrotated dimensions
//   are copied, so f64 rows promise bit equality there and this bound in the
//   rotated dimensions. A narrower format rounds both doubles to the same
//   element unless they straddle a rounding boundary: one format step.
// * Attention, f64: rotated queries and keys differ as above, and the sums
//   run in another order (splits, warps). With D = head_dim, W = columns,
//   scores s = scale * q.k differ by ds <= scale * D * (dq * 2K + 2Q * dk)
//   + 2 (D + 2) u * scale * D * 4QK (Q, K, V: largest input magnitudes,
//   |rotated| <= 2 * largest), softmax turns that into at most 2 ds in the
//   l1 norm of the weights, so outputs differ by <= 2 ds V + 2 (W + 4) u V.
// * Attention, float formats: both sides narrow the scaled query to f32,
//   accumulate in f32; the production kernel (ring_fast_attend.cuh) also
//   carries the query and the weights as bf16 hi + lo pairs (16 significant
//   bits: relative error <= 2^-17). The same bound holds with the RoPE terms
//   replaced by 2^-16 (both sides' query rounding) and u by 2^-24.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "impl/cuda/cuda_backend.hpp"
#include "impl/kv_cache.hpp"
#include "support/prng.hpp"

namespace {

using kvcheck::impl::CacheError;
using kvcheck::impl::ElementFormat;
using kvcheck::impl::KvBackend;
using kvcheck::impl::KvSource;
using kvcheck::impl::PoolSpec;
using kvcheck::impl::RopeStyle;
using kvcheck::impl::StoreReport;
using kvcheck::impl::Tag;

struct Layout {
  const char* name;
  std::int32_t q_heads, kv_heads;
  bool shared;
};
constexpr Layout kLayouts[] = {
    {"mha", 2, 2, false}, {"gqa", 8, 2, false}, {"mqa", 6, 1, false}, {"shared-row", 4, 1, true}};
constexpr ElementFormat kFormats[] = {ElementFormat::kF64, ElementFormat::kF32, ElementFormat::kBf16,
                                      ElementFormat::kFp8};

/// A CPU and a CUDA backend configured with the same spec.
struct Pair {
  std::unique_ptr<KvBackend> cpu, cuda;
  explicit Pair(const PoolSpec& spec) {
    std::string why;
    cpu = kvcheck::impl::make_backend("cpu", &why);
    cuda = kvcheck::impl::make_backend("cuda", &why);
    INFO(why);
    REQUIRE(cpu);
    REQUIRE(cuda);
    const auto a = cpu->configure(spec);
    const auto b = cuda->configure(spec);
    INFO(a.detail << " / " << b.detail);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
  }
};

PoolSpec make_spec(ElementFormat f, const Layout& l, std::int32_t head_dim) {
  PoolSpec s;
  s.states = 3;
  s.ring_rows = 11;
  s.window_keys = 7;
  s.q_heads = l.q_heads;
  s.kv_heads = l.kv_heads;
  s.head_dim = head_dim;
  s.shared_row = l.shared;
  s.format = f;
  s.rope_style = l.shared ? RopeStyle::kInterleaved : RopeStyle::kNeox;
  s.rope_dims = head_dim >= 4 ? (head_dim / 2) * 2 : 0;
  if (s.rope_dims == 0) s.rope_style = RopeStyle::kNone;
  s.max_step_rows = 6;
  return s;
}

std::vector<double> random_rows(kvcheck::Prng& prng, std::int64_t n, double magnitude) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = prng.signed_unit() * magnitude;
  return v;
}

constexpr double kU64 = 0x1.0p-53;
constexpr double kU32 = 0x1.0p-24;
/// Largest magnitude of the random rows store_both writes, and its largest position.
constexpr double kRowMagnitude = 2.0;
constexpr std::int64_t kMaxStorePosition = 5000;

/// Device and host RoPE of a pair with |x| + |y| <= pair_sum at position p.
double rope_difference(double pair_sum, std::int64_t position) {
  return pair_sum * (7.0 + 5.0 * static_cast<double>(position)) * kU64;
}

/// Allowed difference of one stored element whose CPU value is x: f64 rows
/// differ only in rotated key dimensions, by the RoPE bound; other formats
/// round to the same element or, across a rounding boundary, to the next.
double row_tolerance(ElementFormat f, double x, bool rotated) {
  if (f == ElementFormat::kF64) {
    return rotated ? rope_difference(2.0 * kRowMagnitude, kMaxStorePosition) : 0.0;
  }
  return 2.0 * kvcheck::format_unit_roundoff(f) * std::fabs(x) + 1e-300;
}

/// Inputs of an attention comparison, for its error bound.
struct AttendBound {
  ElementFormat format;
  std::int32_t head_dim;
  std::int64_t width;
  double scale;
  double q, k, v;                       // largest magnitudes of query, key, value inputs
  std::int64_t q_position, k_position;  // largest positions of queries and stored keys
};

/// Largest allowed |cpu - cuda| of one attention output (see the top of the file).
double attend_tolerance(const AttendBound& b) {
  const double d = b.head_dim;
  const double qk = d * 2.0 * b.q * 2.0 * b.k;  // bound of sum |q_rot| |k_rot|
  double ds = 0.0, u = 0.0;
  if (b.format == ElementFormat::kF64) {
    u = kU64;
    const double dq = rope_difference(2.0 * b.q, b.q_position);
    const double dk = rope_difference(2.0 * b.k, b.k_position);
    ds = b.scale * d * (dq * 2.0 * b.k + 2.0 * b.q * dk) + 2.0 * (d + 2.0) * u * b.scale * qk;
  } else {
    u = kU32;
    ds = b.scale * qk * (0x1.0p-16 + 2.0 * (d + 2.0) * u);
  }
  const double weights = b.format == ElementFormat::kF64 ? 0.0 : 0x1.0p-16;
  return 2.0 * ds * b.v + (2.0 * (static_cast<double>(b.width) + 4.0) * u + weights) * b.v + 1e-300;
}

/// Stores the same rows into both backends and checks the reports agree.
void store_both(Pair& p, const PoolSpec& spec, kvcheck::Prng& prng, const std::vector<std::int64_t>& slots,
                std::uint64_t* seq) {
  const auto n = static_cast<std::int64_t>(slots.size());
  const std::int64_t e = static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim;
  const auto k = random_rows(prng, n * e, 2.0);
  const auto v = random_rows(prng, n * e, 2.0);
  std::vector<std::int64_t> positions;
  std::vector<Tag> tags;
  for (std::int64_t i = 0; i < n; ++i) {
    positions.push_back(prng.range(0, 5000));
    tags.push_back(Tag{prng.range(0, 9), positions.back(), ++*seq});
  }
  StoreReport a, b;
  const auto sa = p.cpu->store(slots, positions, k.data(), spec.shared_row ? nullptr : v.data(), tags, &a);
  const auto sb = p.cuda->store(slots, positions, k.data(), spec.shared_row ? nullptr : v.data(), tags, &b);
  INFO(sa.detail << " / " << sb.detail);
  REQUIRE(sa.ok());
  REQUIRE(sb.ok());
  REQUIRE(a.duplicate_slots == b.duplicate_slots);
}

void require_pools_equal(Pair& p, const PoolSpec& spec) {
  const std::int64_t e = static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim;
  std::vector<double> ka(static_cast<std::size_t>(e)), va(ka.size()), kb(ka.size()), vb(ka.size());
  const bool rope = spec.rope_style != RopeStyle::kNone;
  for (std::int64_t slot = 0; slot < spec.states * spec.ring_rows; ++slot) {
    INFO("slot " << slot);
    REQUIRE(p.cpu->slot_tag(slot) == p.cuda->slot_tag(slot));
    REQUIRE(p.cpu->read_row(slot, ka.data(), va.data()).ok());
    REQUIRE(p.cuda->read_row(slot, kb.data(), vb.data()).ok());
    for (std::size_t i = 0; i < ka.size(); ++i) {
      const bool rotated =
          rope && static_cast<std::int32_t>(i % static_cast<std::size_t>(spec.head_dim)) < spec.rope_dims;
      INFO("element " << i << " cpu " << ka[i] << " / " << va[i] << " cuda " << kb[i] << " / " << vb[i]);
      REQUIRE(std::fabs(ka[i] - kb[i]) <= row_tolerance(spec.format, ka[i], rotated));
      // The shared-row layout has no value row: read_row returns the key row.
      REQUIRE(std::fabs(va[i] - vb[i]) <= row_tolerance(spec.format, va[i], rotated && spec.shared_row));
    }
  }
}

}  // namespace

TEST_CASE("CudaBackend: stored rows and tags equal the CPU backend's in every format and layout", "[cuda]") {
  for (const auto& l : kLayouts) {
    for (const auto f : kFormats) {
      for (std::int32_t hd : {1, 7, 32, 64}) {
        INFO(l.name << " " << kvcheck::format_name(f) << " head_dim " << hd);
        const PoolSpec spec = make_spec(f, l, hd);
        Pair p(spec);
        kvcheck::Prng prng(17 + hd);
        std::uint64_t seq = 0;
        store_both(p, spec, prng, {0, 1, 2, 12, 32}, &seq);
        store_both(p, spec, prng, {2, 3, 4, 5, 6, 7}, &seq);
        require_pools_equal(p, spec);
      }
    }
  }
}

TEST_CASE("CudaBackend: a same-launch write-write collision is counted and the last row wins", "[cuda]") {
  const PoolSpec spec = make_spec(ElementFormat::kBf16, kLayouts[1], 16);
  Pair p(spec);
  kvcheck::Prng prng(5);
  std::uint64_t seq = 0;
  const std::vector<std::int64_t> slots = {5, 5, 7, 7, 7, 9};
  const std::int64_t e = static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim;
  const auto k = random_rows(prng, 6 * e, 1.0);
  const auto v = random_rows(prng, 6 * e, 1.0);
  const std::vector<std::int64_t> positions = {1, 2, 3, 4, 5, 6};
  std::vector<Tag> tags;
  for (std::int64_t i = 0; i < 6; ++i) tags.push_back(Tag{1, positions[static_cast<std::size_t>(i)], ++seq});
  StoreReport report;
  REQUIRE(p.cuda->store(slots, positions, k.data(), v.data(), tags, &report).ok());
  REQUIRE(report.duplicate_slots == 2);
  REQUIRE(p.cuda->slot_tag(5) == tags[1]);
  REQUIRE(p.cuda->slot_tag(7) == tags[4]);
  REQUIRE(p.cuda->slot_tag(9) == tags[5]);
  StoreReport cpu_report;
  REQUIRE(p.cpu->store(slots, positions, k.data(), v.data(), tags, &cpu_report).ok());
  REQUIRE(cpu_report.duplicate_slots == 2);
  require_pools_equal(p, spec);
  // A store without collisions right after reports none (counters were reset).
  REQUIRE(p.cuda
              ->store(std::span(slots.data() + 5, 1), std::span(positions.data(), 1), k.data(), v.data(),
                      std::span(tags.data(), 1), &report)
              .ok());
  REQUIRE(report.duplicate_slots == 0);
}

TEST_CASE("CudaBackend: attention over pool and scratch equals the CPU backend's", "[cuda]") {
  for (const auto& l : kLayouts) {
    for (const auto f : kFormats) {
      for (std::int32_t hd : {2, 7, 64, 96, 128, 200}) {
        for (const bool sink : {false, true}) {
          INFO(l.name << " " << kvcheck::format_name(f) << " head_dim " << hd << " sink " << sink);
          PoolSpec spec = make_spec(f, l, hd);
          spec.has_sink = sink;
          spec.sink_logit = 0.25;
          Pair p(spec);
          kvcheck::Prng prng(1000 + hd + (sink ? 1 : 0));
          std::uint64_t seq = 0;
          std::vector<std::int64_t> all;
          for (std::int64_t s = 0; s < spec.states * spec.ring_rows; ++s) all.push_back(s);
          for (std::size_t first = 0; first < all.size(); first += 6) {
            const std::size_t count = std::min<std::size_t>(6, all.size() - first);
            store_both(p, spec, prng,
                       std::vector<std::int64_t>(all.begin() + first, all.begin() + first + count), &seq);
          }
          // Pool attention: 5 queries, width 9 with -1 padding and a repeat.
          const std::int64_t n = 5, width = 9;
          std::vector<std::int64_t> index(n * width, -1);
          for (std::int64_t i = 0; i < n; ++i) {
            for (std::int64_t c = 0; c < i + 3; ++c)
              index[i * width + c] = prng.range(0, spec.states * spec.ring_rows - 1);
          }
          index[0] = index[1];
          const auto q = random_rows(prng, n * spec.q_heads * hd, 1.5);
          const std::vector<std::int64_t> positions = {3, 40, 41, 1000, 77};
          for (const KvSource source : {KvSource::kPool, KvSource::kScratch}) {
            if (source == KvSource::kScratch) {
              // Gather a window (with a hole) and add two new rows behind it.
              std::vector<std::int64_t> gather = {4, -1, 7, 30, 2, 11};
              REQUIRE(p.cpu->load(gather, 0).ok());
              REQUIRE(p.cuda->load(gather, 0).ok());
              const std::int64_t e = static_cast<std::int64_t>(spec.kv_heads) * hd;
              const auto k = random_rows(prng, 2 * e, 1.0);
              const auto v = random_rows(prng, 2 * e, 1.0);
              const std::vector<std::int64_t> origins = {12, 13}, rp = {50, 51};
              const std::vector<Tag> tags = {Tag{3, 50, ++seq}, Tag{3, 51, ++seq}};
              const double* vp = spec.shared_row ? nullptr : v.data();
              REQUIRE(p.cpu->scratch_store(6, origins, rp, k.data(), vp, tags).ok());
              REQUIRE(p.cuda->scratch_store(6, origins, rp, k.data(), vp, tags).ok());
              for (auto& x : index) x = x < 0 ? -1 : x % 8;
            }
            std::vector<double> oa(static_cast<std::size_t>(n * spec.q_heads * hd)), ob(oa.size());
            std::vector<Tag> ta(index.size()), tb(index.size());
            std::vector<std::int64_t> ra(index.size()), rb(index.size());
            REQUIRE(p.cpu->attend(source, positions, q.data(), index, width, oa.data(), ta.data(), ra.data())
                        .ok());
            const auto st =
                p.cuda->attend(source, positions, q.data(), index, width, ob.data(), tb.data(), rb.data());
            INFO(st.detail);
            REQUIRE(st.ok());
            REQUIRE(ta == tb);
            REQUIRE(ra == rb);
            AttendBound bound{f,
                              hd,
                              width,
                              1.0 / std::sqrt(static_cast<double>(hd)),
                              1.5,
                              kRowMagnitude,
                              kRowMagnitude,
                              1000,
                              kMaxStorePosition};
            const double tolerance = attend_tolerance(bound);
            for (std::size_t i = 0; i < oa.size(); ++i) {
              INFO("output " << i << " cpu " << oa[i] << " cuda " << ob[i] << " bound " << tolerance);
              REQUIRE(std::fabs(oa[i] - ob[i]) <= tolerance);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("CudaBackend: refused calls answer like the CPU backend and change nothing", "[cuda]") {
  const PoolSpec spec = make_spec(ElementFormat::kFp8, kLayouts[2], 32);
  Pair p(spec);
  kvcheck::Prng prng(9);
  std::uint64_t seq = 0;
  store_both(p, spec, prng, {0, 1, 2, 3}, &seq);
  const std::int64_t e = static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim;
  auto k = random_rows(prng, 2 * e, 1.0);
  auto v = random_rows(prng, 2 * e, 1.0);
  const std::vector<std::int64_t> slots = {1, 2}, positions = {1, 2};
  const std::vector<Tag> tags = {Tag{1, 1, 100}, Tag{1, 2, 101}};
  auto both = [&](auto&& call) {
    const auto a = call(*p.cpu);
    const auto b = call(*p.cuda);
    INFO(a.detail << " / " << b.detail);
    REQUIRE(a.code == b.code);
    REQUIRE(!b.ok());
  };
  k[3] = std::nan("");
  both([&](KvBackend& b) { return b.store(slots, positions, k.data(), v.data(), tags, nullptr); });
  k[3] = 1e300;  // finite, but beyond the format's range after RoPE
  both([&](KvBackend& b) { return b.store(slots, positions, k.data(), v.data(), tags, nullptr); });
  k[3] = 0.5;
  const std::vector<std::int64_t> bad_slots = {1, 999};
  both([&](KvBackend& b) { return b.store(bad_slots, positions, k.data(), v.data(), tags, nullptr); });
  const std::vector<std::int64_t> bad_positions = {1, -2};
  both([&](KvBackend& b) { return b.store(slots, bad_positions, k.data(), v.data(), tags, nullptr); });
  both([&](KvBackend& b) { return b.load(std::vector<std::int64_t>{0, 1}, 1000); });
  require_pools_equal(p, spec);
}

namespace {

/// A production-shaped pool (head_dim 128, W = 4096) of format f with
/// q_heads / kv_heads query heads, rows stored at slot order positions.
PoolSpec production_spec(ElementFormat f, std::int32_t q_heads, std::int32_t kv_heads, bool rope) {
  PoolSpec s;
  s.states = 2;
  s.window_keys = 4096;
  s.ring_rows = 4096 + 64;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.head_dim = 128;
  s.format = f;
  s.rope_style = rope ? RopeStyle::kNeox : RopeStyle::kNone;
  s.rope_dims = rope ? 128 : 0;
  s.softmax_scale = 1.0 / 16.0;  // a power of two: exact scores stay exact
  s.max_step_rows = 520;
  return s;
}

/// Stores rows into every slot of both backends: value row of slot s is
/// value(s) in every element, key rows come from key(slot, element).
template <class KeyFn, class ValueFn>
void fill_both(Pair& p, const PoolSpec& spec, KeyFn key, ValueFn value) {
  const std::int64_t e = static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim;
  const std::int64_t slots = spec.states * spec.ring_rows;
  std::uint64_t seq = 0;
  for (std::int64_t first = 0; first < slots; first += spec.max_step_rows) {
    const std::int64_t n = std::min(spec.max_step_rows, slots - first);
    std::vector<std::int64_t> where, positions;
    std::vector<Tag> tags;
    std::vector<double> k(static_cast<std::size_t>(n * e)), v(k.size());
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t slot = first + r;
      where.push_back(slot);
      positions.push_back(100000 + slot);
      tags.push_back(Tag{slot / spec.ring_rows, positions.back(), ++seq});
      for (std::int64_t i = 0; i < e; ++i) {
        k[static_cast<std::size_t>(r * e + i)] = key(slot, i);
        v[static_cast<std::size_t>(r * e + i)] = value(slot, i);
      }
    }
    const auto a = p.cpu->store(where, positions, k.data(), v.data(), tags, nullptr);
    const auto b = p.cuda->store(where, positions, k.data(), v.data(), tags, nullptr);
    INFO(a.detail << " / " << b.detail);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
  }
}

/// n index rows of width 4096 over state 0 and 1, cycling through three:
/// the whole window in ring order, a shuffled window with every seventh
/// column skipped, and 100 columns followed by skips (whole splits with
/// nothing to read). Few queries run the fast kernel's split-K path (one
/// block per KV head), many its slot-major path (one block per query).
std::vector<std::int64_t> production_index(const PoolSpec& spec, kvcheck::Prng& prng, std::int64_t n) {
  const std::int64_t w = spec.window_keys;
  std::vector<std::int64_t> index(static_cast<std::size_t>(3 * w), -1);
  for (std::int64_t c = 0; c < w; ++c) index[static_cast<std::size_t>(c)] = (37 + c) % spec.ring_rows;
  std::vector<std::int64_t> shuffled;
  for (std::int64_t c = 0; c < w; ++c) shuffled.push_back(spec.ring_rows + c);
  for (std::int64_t i = w - 1; i > 0; --i)
    std::swap(shuffled[static_cast<std::size_t>(i)], shuffled[static_cast<std::size_t>(prng.range(0, i))]);
  for (std::int64_t c = 0; c < w; ++c) {
    index[static_cast<std::size_t>(w + c)] = c % 7 == 3 ? -1 : shuffled[static_cast<std::size_t>(c)];
  }
  for (std::int64_t c = 0; c < 100; ++c) index[static_cast<std::size_t>(2 * w + c)] = 500 + 3 * c;
  for (std::int64_t i = 3; i < n; ++i) {
    index.insert(index.end(), index.begin() + (i % 3) * w, index.begin() + (i % 3 + 1) * w);
  }
  index.resize(static_cast<std::size_t>(n * w));
  return index;
}

/// Positions of n production queries (their RoPE angles).
std::vector<std::int64_t> production_positions(std::int64_t n) {
  std::vector<std::int64_t> positions = {100000, 100001, 250000};
  for (std::int64_t i = 3; i < n; ++i) positions.push_back(100000 + 977 * i);
  positions.resize(static_cast<std::size_t>(n));
  return positions;
}

}  // namespace

TEST_CASE("CudaBackend: production shapes (head_dim 128 and W = 4096) count every column once", "[cuda]") {
  // Uniform weights (q = 0) over values that are small dyadic numbers: every
  // sum is exact in f32 on both sides, so the output is the exact mean of
  // the values read, and a column dropped or read twice moves it by at
  // least 1/(8 * 4096) of the range, far past the 2^-20 allowed here.
  for (const auto f : {ElementFormat::kBf16, ElementFormat::kFp8, ElementFormat::kF32}) {
    for (const auto& [qh, kvh] : {std::pair{32, 8}, std::pair{24, 2}, std::pair{8, 8}, std::pair{32, 4}}) {
      INFO(kvcheck::format_name(f) << " q_heads " << qh << " kv_heads " << kvh);
      const PoolSpec spec = production_spec(f, qh, kvh, true);
      Pair p(spec);
      fill_both(
          p, spec, [](std::int64_t s, std::int64_t i) { return ((s * 31 + i) % 9 - 4) / 4.0; },
          [](std::int64_t s, std::int64_t i) { return ((s * 13 + i / 128) % 7 + 1) / 8.0; });
      for (const std::int64_t n : {std::int64_t{3}, std::int64_t{24}}) {
        INFO("queries " << n);
        kvcheck::Prng prng(77);
        const auto index = production_index(spec, prng, n);
        const std::int64_t w = spec.window_keys;
        const std::vector<double> q(static_cast<std::size_t>(n * qh * 128), 0.0);
        const std::vector<std::int64_t> positions = production_positions(n);
        std::vector<double> oa(q.size()), ob(q.size());
        REQUIRE(
            p.cpu->attend(KvSource::kPool, positions, q.data(), index, w, oa.data(), nullptr, nullptr).ok());
        REQUIRE(
            p.cuda->attend(KvSource::kPool, positions, q.data(), index, w, ob.data(), nullptr, nullptr).ok());
        for (std::int64_t i = 0; i < n; ++i) {
          for (std::int32_t h = 0; h < qh; ++h) {
            const std::int32_t kv = h / (qh / kvh);
            double sum = 0.0;
            std::int64_t count = 0;
            for (std::int64_t c = 0; c < w; ++c) {
              const std::int64_t slot = index[static_cast<std::size_t>(i * w + c)];
              if (slot < 0) continue;
              sum += ((slot * 13 + kv) % 7 + 1) / 8.0;
              ++count;
            }
            const double exact = sum / static_cast<double>(count);
            for (std::int32_t d = 0; d < 128; ++d) {
              const auto at = static_cast<std::size_t>((i * qh + h) * 128 + d);
              INFO("query " << i << " head " << h << " dim " << d << " exact " << exact << " cpu " << oa[at]
                            << " cuda " << ob[at]);
              REQUIRE(std::fabs(oa[at] - exact) <= 0x1.0p-20 * exact);
              REQUIRE(std::fabs(ob[at] - exact) <= 0x1.0p-20 * exact);
            }
          }
        }
      }
    }
  }
}

TEST_CASE(
    "CudaBackend: production shapes (head_dim 128 and W = 4096) attend within the error "
    "bound of the CPU backend",
    "[cuda]") {
  for (const auto f : {ElementFormat::kBf16, ElementFormat::kFp8}) {
    for (const auto& [qh, kvh] : {std::pair{32, 8}, std::pair{24, 2}, std::pair{32, 4}}) {
      for (const bool sink : {false, true}) {
        INFO(kvcheck::format_name(f) << " q_heads " << qh << " kv_heads " << kvh << " sink " << sink);
        PoolSpec spec = production_spec(f, qh, kvh, true);
        spec.has_sink = sink;
        spec.sink_logit = 1.5;
        Pair p(spec);
        kvcheck::Prng prng(300 + qh);
        const std::int64_t e = static_cast<std::int64_t>(kvh) * 128;
        std::vector<double> keys(static_cast<std::size_t>(spec.states * spec.ring_rows * e));
        for (auto& x : keys) x = prng.signed_unit() * 2.0;
        fill_both(
            p, spec,
            [&](std::int64_t s, std::int64_t i) { return keys[static_cast<std::size_t>(s * e + i)]; },
            [](std::int64_t s, std::int64_t i) {
              return std::sin(0.37 * static_cast<double>(s) + 0.11 * static_cast<double>(i));
            });
        for (const std::int64_t n : {std::int64_t{3}, std::int64_t{24}}) {
          INFO("queries " << n);
          const auto index = production_index(spec, prng, n);
          const std::int64_t w = spec.window_keys;
          const auto q = random_rows(prng, n * qh * 128, 1.5);
          const std::vector<std::int64_t> positions = production_positions(n);
          std::vector<double> oa(q.size()), ob(q.size());
          REQUIRE(p.cpu->attend(KvSource::kPool, positions, q.data(), index, w, oa.data(), nullptr, nullptr)
                      .ok());
          REQUIRE(p.cuda->attend(KvSource::kPool, positions, q.data(), index, w, ob.data(), nullptr, nullptr)
                      .ok());
          // The bound of the top of the file with sum |q_rot| |k_rot| measured:
          // rotated query elements bounded by their pair's norm, keys as stored.
          std::vector<double> kr(static_cast<std::size_t>(e)), vr(kr.size());
          std::vector<double> kmag(static_cast<std::size_t>(spec.states * spec.ring_rows * e));
          for (std::int64_t s = 0; s < spec.states * spec.ring_rows; ++s) {
            REQUIRE(p.cpu->read_row(s, kr.data(), vr.data()).ok());
            for (std::int64_t i = 0; i < e; ++i)
              kmag[static_cast<std::size_t>(s * e + i)] = std::fabs(kr[static_cast<std::size_t>(i)]);
          }
          for (std::int64_t i = 0; i < n; ++i) {
            for (std::int32_t h = 0; h < qh; ++h) {
              const std::int32_t kv = h / (qh / kvh);
              const double* qrow = q.data() + (i * qh + h) * 128;
              double qb[128];
              for (int d = 0; d < 64; ++d) qb[d] = qb[d + 64] = std::hypot(qrow[d], qrow[d + 64]);
              double s_max = 0.0;
              for (std::int64_t c = 0; c < w; ++c) {
                const std::int64_t slot = index[static_cast<std::size_t>(i * w + c)];
                if (slot < 0) continue;
                double sum = 0.0;
                for (int d = 0; d < 128; ++d)
                  sum += qb[d] * kmag[static_cast<std::size_t>(slot * e + kv * 128 + d)];
                s_max = std::max(s_max, sum);
              }
              const double ds = spec.softmax_scale * s_max * (0x1.0p-16 + 2.0 * 130.0 * kU32);
              const double tolerance = 2.0 * ds + (2.0 * (static_cast<double>(w) + 4.0) * kU32 + 0x1.0p-16);
              for (std::int32_t d = 0; d < 128; ++d) {
                const auto at = static_cast<std::size_t>((i * qh + h) * 128 + d);
                INFO("query " << i << " head " << h << " dim " << d << " cpu " << oa[at] << " cuda " << ob[at]
                              << " bound " << tolerance);
                REQUIRE(std::fabs(oa[at] - ob[at]) <= tolerance);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("CudaBackend: read_row_bytes gives the CPU backend's bytes bit for bit, in every format and layout",
          "[cuda]") {
  for (const auto& l : kLayouts) {
    for (const auto f : kFormats) {
      INFO(l.name << " " << kvcheck::format_name(f));
      // No RoPE: every element is rounded by the same code on both sides.
      PoolSpec spec = make_spec(f, l, 32);
      spec.rope_style = RopeStyle::kNone;
      spec.rope_dims = 0;
      Pair p(spec);
      kvcheck::Prng prng(29);
      std::uint64_t seq = 0;
      store_both(p, spec, prng, {0, 1, 2, 12, 32}, &seq);
      const std::int64_t bytes = kvcheck::format_row_bytes(f, std::int64_t{spec.kv_heads} * spec.head_dim);
      std::vector<std::uint8_t> ka(static_cast<std::size_t>(bytes)), va(ka.size()), kb(ka.size()),
          vb(ka.size());
      for (std::int64_t slot = 0; slot < spec.states * spec.ring_rows; ++slot) {
        INFO("slot " << slot);
        REQUIRE(p.cpu->read_row_bytes(slot, ka.data(), va.data()).ok());
        REQUIRE(p.cuda->read_row_bytes(slot, kb.data(), vb.data()).ok());
        REQUIRE(ka == kb);
        REQUIRE(va == vb);
      }
      const auto bad = p.cuda->read_row_bytes(spec.states * spec.ring_rows, kb.data(), vb.data());
      CHECK(bad.code == CacheError::kSlotOutOfRange);
    }
  }
}

TEST_CASE("CudaBackend: the attention kernels launched are the ones the host dispatch predicts", "[cuda]") {
  // head_dim 128, 32 query heads over 8 KV heads, W = 4096, steps of up to
  // 24 rows: one query runs the warp-pipelined kernel and 24 (24 slot-major
  // blocks x 16 >= the SMs of any GPU up to 384) the slot-major one, both
  // over several splits; f32 runs the general kernel.
  for (const auto f : {ElementFormat::kBf16, ElementFormat::kFp8, ElementFormat::kF32}) {
    PoolSpec spec = production_spec(f, 32, 8, true);
    spec.max_step_rows = 24;
    Pair p(spec);
    REQUIRE(p.cuda->attend_paths().size() == 4);
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{24}}) {
      INFO(kvcheck::format_name(f) << " queries " << n);
      const std::vector<std::int64_t> queries = {n};
      const std::vector<bool> predicted = p.cuda->attend_paths_run(spec, queries);
      const std::vector<std::int64_t> before = p.cuda->attend_paths_launched();
      kvcheck::Prng prng(5);
      const auto index = production_index(spec, prng, n);
      const std::vector<double> q(static_cast<std::size_t>(n * 32 * 128), 0.25);
      std::vector<double> out(q.size());
      const auto st = p.cuda->attend(KvSource::kPool, production_positions(n), q.data(), index,
                                     spec.window_keys, out.data(), nullptr, nullptr);
      INFO(st.detail);
      REQUIRE(st.ok());
      const std::vector<std::int64_t> after = p.cuda->attend_paths_launched();
      for (std::size_t i = 0; i < predicted.size(); ++i) CHECK((after[i] > before[i]) == predicted[i]);
      const bool fast = f != ElementFormat::kF32;
      CHECK(predicted[0] == !fast);              // general
      CHECK(predicted[1] == (fast && n == 24));  // slot-major
      CHECK(predicted[2] == (fast && n == 1));   // warp-pipelined
      CHECK(predicted[3]);                       // split-K: 4096 columns
    }
  }
}
