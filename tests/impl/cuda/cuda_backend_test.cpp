// The CUDA backend against the CPU backend, kernel by kernel: both get the
// same calls, and every answer (metadata, index, stored rows, tags,
// duplicates, attention outputs, read tags and slots, refusals) must agree,
// exactly for integers and tags, within the element format for rows, and
// within float accumulation for attention. Needs a device: without one,
// every case here reports itself skipped by name (cuda_skip_listener.cpp).
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
using kvcheck::impl::QueryRef;
using kvcheck::impl::ReadMeta;
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
                                      ElementFormat::kFp8E4m3};

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
  s.window_rows = 7;
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

double row_tolerance(ElementFormat f, double x) {
  // Device and host cos/sin may differ by an ulp, which can flip one
  // rounding of the stored element: allow one element-format step.
  return 2.0 * kvcheck::impl::format_epsilon(f) * std::fabs(x) + 1e-300;
}

/// Stores the same rows into both backends and checks the reports agree.
void store_both(Pair& p, const PoolSpec& spec, kvcheck::Prng& prng,
                const std::vector<std::int64_t>& slots, std::uint64_t* seq) {
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
  for (std::int64_t slot = 0; slot < spec.states * spec.ring_rows; ++slot) {
    INFO("slot " << slot);
    REQUIRE(p.cpu->slot_tag(slot) == p.cuda->slot_tag(slot));
    REQUIRE(p.cpu->read_row(slot, ka.data(), va.data()).ok());
    REQUIRE(p.cuda->read_row(slot, kb.data(), vb.data()).ok());
    for (std::size_t i = 0; i < ka.size(); ++i) {
      REQUIRE(std::fabs(ka[i] - kb[i]) <= row_tolerance(spec.format, ka[i]));
      REQUIRE(std::fabs(va[i] - vb[i]) <= row_tolerance(spec.format, va[i]));
    }
  }
}

}  // namespace

TEST_CASE("CudaBackend: metadata and index expansion equal the CPU backend's", "[cuda]") {
  PoolSpec spec = make_spec(ElementFormat::kF32, kLayouts[0], 4);
  spec.states = 4;
  spec.ring_rows = 134;
  spec.window_rows = 128;
  spec.max_step_rows = 8;
  for (int f = 0; f < kvcheck::impl::kFaultCount; ++f) {
    spec.fault = static_cast<kvcheck::impl::Fault>(f);
    Pair p(spec);
    std::vector<QueryRef> queries;
    for (std::int64_t pos : {0, 1, 126, 127, 128, 133, 134, 135, 300, 100000}) {
      for (std::int64_t s = 0; s < spec.states; ++s) queries.push_back({s, pos});
    }
    std::vector<ReadMeta> ma(queries.size()), mb(queries.size());
    REQUIRE(p.cpu->metadata(queries, ma).ok());
    REQUIRE(p.cuda->metadata(queries, mb).ok());
    for (std::size_t i = 0; i < queries.size(); ++i) {
      REQUIRE(ma[i].read_offset == mb[i].read_offset);
      REQUIRE(ma[i].length == mb[i].length);
      REQUIRE(ma[i].write_slot == mb[i].write_slot);
    }
    const std::int64_t width = 129;
    std::vector<std::int64_t> ia(ma.size() * width), ib(ia.size());
    // The index staging holds max_step_rows * scratch rows: expand in steps.
    for (std::size_t first = 0; first < ma.size(); first += 8) {
      const std::size_t count = std::min<std::size_t>(8, ma.size() - first);
      const std::span<const ReadMeta> m(ma.data() + first, count);
      REQUIRE(p.cpu->expand_index(m, width, std::span(ia.data() + first * width, count * width)).ok());
      REQUIRE(p.cuda->expand_index(m, width, std::span(ib.data() + first * width, count * width)).ok());
    }
    REQUIRE(ia == ib);
    // Refusals agree too.
    const QueryRef bad[] = {{spec.states, 0}};
    REQUIRE(p.cuda->metadata(bad, std::span(mb.data(), 1)).code == CacheError::kStateOutOfRange);
  }
}

TEST_CASE("CudaBackend: stored rows and tags equal the CPU backend's in every format and layout",
          "[cuda]") {
  for (const auto& l : kLayouts) {
    for (const auto f : kFormats) {
      for (std::int32_t hd : {1, 7, 32, 64}) {
        INFO(l.name << " " << kvcheck::impl::format_name(f) << " head_dim " << hd);
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

TEST_CASE("CudaBackend: a same-launch write-write collision is counted and the last row wins",
          "[cuda]") {
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
  REQUIRE(p.cuda->store(std::span(slots.data() + 5, 1), std::span(positions.data(), 1), k.data(),
                        v.data(), std::span(tags.data(), 1), &report)
              .ok());
  REQUIRE(report.duplicate_slots == 0);
}

TEST_CASE("CudaBackend: attention over pool and scratch equals the CPU backend's", "[cuda]") {
  for (const auto& l : kLayouts) {
    for (const auto f : kFormats) {
      for (std::int32_t hd : {2, 7, 64, 96, 128, 200}) {
        for (const bool sink : {false, true}) {
          INFO(l.name << " " << kvcheck::impl::format_name(f) << " head_dim " << hd << " sink "
                      << sink);
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
            store_both(p, spec, prng, std::vector<std::int64_t>(all.begin() + first, all.begin() + first + count), &seq);
          }
          // Pool attention: 5 queries, width 9 with -1 padding and a repeat.
          const std::int64_t n = 5, width = 9;
          std::vector<std::int64_t> index(n * width, -1);
          for (std::int64_t i = 0; i < n; ++i) {
            for (std::int64_t c = 0; c < i + 3; ++c) index[i * width + c] = prng.range(0, spec.states * spec.ring_rows - 1);
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
            REQUIRE(p.cpu->attend(source, positions, q.data(), index, width, oa.data(), ta.data(), ra.data()).ok());
            const auto st = p.cuda->attend(source, positions, q.data(), index, width, ob.data(), tb.data(), rb.data());
            INFO(st.detail);
            REQUIRE(st.ok());
            REQUIRE(ta == tb);
            REQUIRE(ra == rb);
            const double unit = f == ElementFormat::kF64 ? 0x1.0p-50 : 0x1.0p-18;
            for (std::size_t i = 0; i < oa.size(); ++i) {
              INFO("output " << i << " cpu " << oa[i] << " cuda " << ob[i]);
              REQUIRE(std::fabs(oa[i] - ob[i]) <= unit * (1.0 + std::fabs(oa[i])) * 8.0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("CudaBackend: refused calls answer like the CPU backend and change nothing", "[cuda]") {
  const PoolSpec spec = make_spec(ElementFormat::kFp8E4m3, kLayouts[2], 32);
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
