// Numerics judged, both ways: a correct cache never fails for numerical
// reasons (long context, any RoPE base the loader accepts, every format),
// and a cache that encodes or rotates wrongly is caught: bf16 conversion by
// truncation, an fp8 block scale one power of two too large, RoPE angles
// formed in float32. The faulty caches are a small test-only cache
// (NaiveCache) whose encoder and rotation are chosen per test; the correct
// side is the in-tree CPU ring pool and NaiveCache with the right choices.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <memory>

#include "engines/cache_under_test.hpp"
#include "engines/ring_pool_cache.hpp"
#include "impl/cpu/cpu_backend.hpp"
#include "impl/element_format.hpp"
#include "impl/row_codec.hpp"
#include "model/attention.hpp"
#include "model/encoding.hpp"
#include "properties/rows.hpp"
#include "properties/runner.hpp"
#include "properties/stored_rows.hpp"
#include "properties/tolerance.hpp"
#include "properties/value_profiles.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/prng.hpp"

using namespace kvcheck;
using namespace kvcheck::properties;

namespace {

/// What the test-only cache gets wrong (kCorrect: nothing).
enum class Flaw { kCorrect, kBf16Truncate, kFp8ScaleTwice, kF32AngleTable, kNoMaxSubtraction };

/// Encodes one row the way a cache with `flaw` does.
void flawed_encode(Flaw flaw, impl::ElementFormat f, const double* in, std::int64_t n, std::uint8_t* row) {
  if (flaw == Flaw::kBf16Truncate && f == impl::ElementFormat::kBf16) {
    for (std::int64_t i = 0; i < n; ++i) {
      const auto h = static_cast<std::uint16_t>(impl::format_float_bits(static_cast<float>(in[i])) >> 16);
      std::memcpy(row + 2 * i, &h, 2);
    }
    return;
  }
  if (flaw == Flaw::kFp8ScaleTwice && f == impl::ElementFormat::kFp8) {
    for (std::int64_t b0 = 0; b0 < n; b0 += 32) {
      const std::int64_t b1 = std::min(n, b0 + 32);
      double amax = 0;
      for (std::int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(in[i]));
      const auto s = static_cast<std::uint8_t>(impl::ue8m0_choose(amax) + 1);  // twice the right scale
      row[n + b0 / 32] = s;
      for (std::int64_t i = b0; i < b1; ++i)
        row[i] = impl::fp8_e4m3_encode(in[i] * impl::format_pow2(127 - s));
    }
    return;
  }
  impl::encode_row(f, in, n, row);
}

/// Rotates one head in double like a production kernel; with
/// kF32AngleTable the angle p * theta is formed in float32.
void rotate(Flaw flaw, const scenarios::Rope& rope, std::int64_t p, double* head) {
  if (rope.style == scenarios::RopeStyle::kNone || rope.rotary_dims == 0) return;
  const std::int32_t half = rope.rotary_dims / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    const double theta = std::pow(rope.base, -2.0 * i / rope.rotary_dims);
    const double angle = flaw == Flaw::kF32AngleTable
                             ? static_cast<double>(static_cast<float>(p) * static_cast<float>(theta))
                             : static_cast<double>(p) * theta;
    const bool neox = rope.style == scenarios::RopeStyle::kNeox;
    const std::size_t a = neox ? static_cast<std::size_t>(i) : static_cast<std::size_t>(2 * i);
    const std::size_t b = neox ? static_cast<std::size_t>(i + half) : static_cast<std::size_t>(2 * i + 1);
    const double x = head[a], y = head[b];
    head[a] = x * std::cos(angle) - y * std::sin(angle);
    head[b] = x * std::sin(angle) + y * std::cos(angle);
  }
}

/// A plain cache for one request at a time: every position keeps its own
/// row (slot = position), a query attends, in double with the maximum
/// subtracted, to the window's rows. Prefill and decode only.
class NaiveCache final : public engines::CacheUnderTest {
 public:
  NaiveCache(engines::CacheSpec spec, Flaw flaw, bool report_bytes)
      : spec_(std::move(spec)), flaw_(flaw), report_bytes_(report_bytes) {}

  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    if (answer) answer->clear();
    if (c.op == engines::StepCall::Op::kBegin || c.rows == 0 || answer == nullptr) return {};
    const auto& cc = spec_.cache;
    const impl::ElementFormat f = cc.format;
    const std::int64_t width = static_cast<std::int64_t>(cc.kv_heads) * cc.head_dim;
    const std::int64_t bytes = format_row_bytes(f, width);
    answer->has_written = answer->has_reads = answer->has_stored = true;
    answer->has_stored_bytes = report_bytes_;
    answer->stored_known.assign(static_cast<std::size_t>(c.rows), 1);
    for (std::int64_t i = 0; i < c.rows; ++i) {
      const std::int64_t p = c.position + i;
      std::vector<double> k(c.k + i * width, c.k + (i + 1) * width);
      for (std::int32_t h = 0; h < cc.kv_heads; ++h) rotate(flaw_, cc.rope, p, k.data() + h * cc.head_dim);
      Row& row = rows_[p];
      row.k.assign(static_cast<std::size_t>(bytes), 0);
      row.v.assign(static_cast<std::size_t>(bytes), 0);
      flawed_encode(flaw_, f, k.data(), width, row.k.data());
      flawed_encode(flaw_, f, c.v + i * width, width, row.v.data());
      answer->written.push_back(p);
      std::vector<double> dk(static_cast<std::size_t>(width)), dv(static_cast<std::size_t>(width));
      impl::decode_row(f, row.k.data(), width, dk.data());
      impl::decode_row(f, row.v.data(), width, dv.data());
      answer->stored_k.insert(answer->stored_k.end(), dk.begin(), dk.end());
      answer->stored_v.insert(answer->stored_v.end(), dv.begin(), dv.end());
      if (report_bytes_) {
        answer->stored_k_bytes.insert(answer->stored_k_bytes.end(), row.k.begin(), row.k.end());
        answer->stored_v_bytes.insert(answer->stored_v_bytes.end(), row.v.begin(), row.v.end());
      }
    }
    answer->read_offsets.push_back(0);
    const std::int32_t d = cc.head_dim, group = cc.q_heads / cc.kv_heads;
    for (std::int64_t i = 0; i < c.rows; ++i) {
      const std::int64_t p = c.position + i;
      const std::int64_t first = std::max<std::int64_t>(0, p - spec_.window_keys + 1);
      std::vector<std::vector<double>> keys, values;
      for (std::int64_t j = first; j <= p; ++j) {
        std::vector<double> dk(static_cast<std::size_t>(width)), dv(static_cast<std::size_t>(width));
        impl::decode_row(f, rows_.at(j).k.data(), width, dk.data());
        impl::decode_row(f, rows_.at(j).v.data(), width, dv.data());
        keys.push_back(std::move(dk));
        values.push_back(std::move(dv));
        answer->read_slots.push_back(j);
      }
      answer->read_offsets.push_back(static_cast<std::int64_t>(answer->read_slots.size()));
      for (std::int32_t h = 0; h < cc.q_heads; ++h) {
        std::vector<double> q(c.q + i * cc.q_heads * d + h * d, c.q + i * cc.q_heads * d + (h + 1) * d);
        rotate(flaw_, cc.rope, p, q.data());
        const std::size_t off = static_cast<std::size_t>(h / group * d);
        std::vector<double> s;
        double peak = flaw_ == Flaw::kNoMaxSubtraction ? 0.0 : -HUGE_VAL;
        for (const auto& k : keys) {
          double dot = 0;
          for (std::int32_t e = 0; e < d; ++e)
            dot += q[static_cast<std::size_t>(e)] * k[off + static_cast<std::size_t>(e)];
          s.push_back(dot * spec_.softmax_scale);
          if (flaw_ != Flaw::kNoMaxSubtraction) peak = std::max(peak, s.back());
        }
        double total = 0;
        for (double& x : s) total += (x = std::exp(x - peak));
        for (std::int32_t e = 0; e < d; ++e) {
          double o = 0;
          for (std::size_t j = 0; j < s.size(); ++j)
            o += s[j] / total * values[j][off + static_cast<std::size_t>(e)];
          answer->out.push_back(o);
        }
      }
    }
    return {};
  }

 private:
  struct Row {
    std::vector<std::uint8_t> k, v;
  };
  engines::CacheSpec spec_;
  Flaw flaw_;
  bool report_bytes_;
  std::map<std::int64_t, Row> rows_;
};

class NaiveProvider final : public engines::CacheProvider {
 public:
  // Out of line: GCC 12 warns (maybe-uninitialized) on the inlined
  // Capabilities initializer lists.
  [[gnu::noinline]] NaiveProvider(Flaw flaw, bool report_bytes) : flaw_(flaw), report_bytes_(report_bytes) {
    caps_.name = "naive";
    caps_.verify = caps_.finish = caps_.reset = false;
    caps_.shared_row = caps_.sink = false;
  }
  const engines::Capabilities& capabilities() override { return caps_; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec, engines::Refusal*) override {
    return std::make_unique<NaiveCache>(spec, flaw_, report_bytes_);
  }
  std::string name() const override { return "naive"; }

 private:
  Flaw flaw_;
  bool report_bytes_;
  engines::Capabilities caps_;
};

/// The example: W keys, one `prefill`-row prefill (stored before
/// read, ring large enough), then one decode.
scenarios::Scenario long_prefill(std::int64_t window, std::int64_t prefill, scenarios::Format format,
                                 std::int32_t head_dim, double base, std::uint64_t seed) {
  scenarios::Scenario sc;
  sc.name = "long-prefill";
  sc.cache.window = window;
  sc.cache.ring_rows = prefill + window + 1;
  sc.cache.head_dim = head_dim;
  sc.cache.format = format;
  sc.cache.rope.style = scenarios::RopeStyle::kNeox;
  sc.cache.rope.rotary_dims = head_dim;
  sc.cache.rope.base = base;
  sc.requests = {{0, 0}};
  sc.data.seed = seed;
  scenarios::Step pre;
  pre.kind = scenarios::StepKind::kPrefill;
  pre.rows = prefill;
  scenarios::Step dec;
  dec.kind = scenarios::StepKind::kDecode;
  sc.steps = {pre, dec};
  return sc;
}

RunObservation run_on(const scenarios::Scenario& sc, engines::CacheProvider* provider) {
  RunOptions o;
  o.provider = provider;
  o.probes = provider == nullptr;
  o.record_reads = false;
  o.record_ring = false;
  return run_scenario(sc, o);
}

}  // namespace

TEST_CASE(
    "Numerics: W=4 with a 100000-row prefill and a decode on f64 rows with NeoX base 10000 passes on the CPU "
    "cache") {
  const auto run = run_on(long_prefill(4, 100000, scenarios::Format::kF64, 4, 10000.0, 1), nullptr);
  INFO(run.first_failure);
  CHECK(run.passed);
  CHECK(run.queries == 100001);
  CHECK(run.stored_rows_checked == 100001);
  CHECK(run.encoding_mismatches == 0);
  // The RoPE part of the tolerance is reported on its own and is what grew.
  CHECK(run.max_rope_tolerance > 0);
  CHECK(run.max_abs_diff <= 1e-12);
  double tolerance = 0;
  for (const auto& q : run.steps.front().queries) tolerance = std::max(tolerance, q.tolerance);
  WARN("p up to 1e5, f64: max |diff| " << run.max_abs_diff << ", largest tolerance " << tolerance
                                       << " of which RoPE " << run.max_rope_tolerance);
}

TEST_CASE("Numerics: the 100000-row example also passes with RoPE base 1e-20 and with bf16 rows") {
  // Base 1e-20 turns every angle past pair 0 into ~1e20 rad: the angle error
  // bound saturates and the RoPE part of the tolerance covers the whole range.
  for (const auto& [format, base] :
       {std::pair{scenarios::Format::kF64, 1e-20}, std::pair{scenarios::Format::kBf16, 10000.0}}) {
    const auto run = run_on(long_prefill(4, 100000, format, 4, base, 2), nullptr);
    INFO(run.first_failure);
    CHECK(run.passed);
    CHECK(run.stored_rows_checked == 100001);
  }
}

TEST_CASE("Numerics: the same run with RoPE angles formed in float32 fails") {
  NaiveProvider bad(Flaw::kF32AngleTable, true);
  const auto run = run_on(long_prefill(4, 100000, scenarios::Format::kF64, 4, 10000.0, 1), &bad);
  CHECK_FALSE(run.passed);
  CHECK(run.encoding_mismatches > 0);
  CHECK(run.output_failures > 0);
  NaiveProvider good(Flaw::kCorrect, true);
  const auto ok = run_on(long_prefill(4, 100000, scenarios::Format::kF64, 4, 10000.0, 1), &good);
  INFO(ok.first_failure);
  CHECK(ok.passed);
}

TEST_CASE("Numerics: bf16 by truncation and an fp8 scale twice too large are caught in every run") {
  const int runs = 20;
  int truncation_caught = 0, scale_caught = 0, scale_caught_values_only = 0;
  for (int seed = 0; seed < runs; ++seed) {
    NaiveProvider trunc(Flaw::kBf16Truncate, true), twice(Flaw::kFp8ScaleTwice, true),
        twice_values(Flaw::kFp8ScaleTwice, false), good(Flaw::kCorrect, true);
    const auto bf =
        long_prefill(8, 40, scenarios::Format::kBf16, 8, 10000.0, static_cast<std::uint64_t>(seed));
    const auto f8 =
        long_prefill(8, 40, scenarios::Format::kFp8, 64, 10000.0, static_cast<std::uint64_t>(seed));
    truncation_caught += run_on(bf, &trunc).passed ? 0 : 1;
    scale_caught += run_on(f8, &twice).passed ? 0 : 1;
    scale_caught_values_only += run_on(f8, &twice_values).passed ? 0 : 1;
    // The same scenarios pass on a correct cache and on the CPU ring pool.
    CHECK(run_on(bf, &good).passed);
    CHECK(run_on(f8, &good).passed);
    CHECK(run_on(bf, nullptr).passed);
    CHECK(run_on(f8, nullptr).passed);
  }
  CHECK(truncation_caught == runs);
  CHECK(scale_caught == runs);
  // Without bytes a too-large scale shows only where an element's rounding
  // changed (subnormal codes): reported, not required.
  WARN("fp8 scale x2 caught from decoded values alone in " << scale_caught_values_only << " of " << runs);
}

TEST_CASE("Numerics: a correct cache is within tolerance at any position up to 2^40 and any RoPE base") {
  // Property: the CPU backend's kernels (store with RoPE at the given
  // positions, attend) against the 113-bit reference, and its stored rows
  // against the reference encoding, over positions, bases and formats.
  Prng rng(20261130);
  const scenarios::Format formats[] = {scenarios::Format::kF64, scenarios::Format::kF32,
                                       scenarios::Format::kBf16, scenarios::Format::kFp8};
  int cases = 0, float_angles_caught = 0, float_angle_cases = 0;
  double rope_tol_at_max = 0;
  for (int c = 0; c < 240; ++c) {
    const scenarios::Format format = formats[c % 4];
    const std::int32_t d = c % 3 == 0 ? 2 : (c % 3 == 1 ? 8 : 64);
    const std::int64_t keys = 1 + static_cast<std::int64_t>(rng.next() % 6);
    const double log2p = c < 8 ? 40.0 : static_cast<double>(rng.next() % 4001) / 100.0;  // 2^0 .. 2^40
    const auto p = std::max<std::int64_t>(keys - 1, static_cast<std::int64_t>(std::exp2(log2p)));
    const double base =
        c % 16 == 5 ? 1e-300
                    : (c % 16 == 6 ? 1e300 : std::pow(10.0, static_cast<double>(rng.next() % 41) - 20.0));
    impl::PoolSpec ps;
    ps.states = 1;
    ps.ring_rows = ps.window_keys = keys;
    ps.head_dim = d;
    ps.format = format;
    ps.rope_style = impl::RopeStyle::kNeox;
    ps.rope_dims = d;
    ps.rope_base = base;
    ps.max_step_rows = keys;
    impl::cpu::CpuBackend cpu;
    REQUIRE(cpu.configure(ps).ok());
    std::vector<double> k, v, q;
    for (std::int64_t i = 0; i < keys * d; ++i)
      k.push_back(rng.signed_unit()), v.push_back(rng.signed_unit());
    for (std::int32_t i = 0; i < d; ++i) q.push_back(rng.signed_unit());
    std::vector<std::int64_t> slots, pos;
    std::vector<impl::Tag> tags;
    for (std::int64_t j = 0; j < keys; ++j) {
      slots.push_back(j);
      pos.push_back(p - keys + 1 + j);
      tags.push_back(impl::Tag{0, p - keys + 1 + j, static_cast<std::uint64_t>(j + 1)});
    }
    impl::StoreReport report;
    REQUIRE(cpu.store(slots, pos, k.data(), v.data(), tags, &report).ok());
    std::vector<double> out(static_cast<std::size_t>(d));
    const std::vector<std::int64_t> qpos{p};
    REQUIRE(
        cpu.attend(impl::KvSource::kPool, qpos, q.data(), slots, keys, out.data(), nullptr, nullptr).ok());

    // The reference: exact rotation, reference encoding, 113-bit attention.
    const model::Rope rope{model::RopeStyle::kNeox, d, base};
    const model::Encoding enc = format;  // one format type: scenario, model and cache
    const double u = format == scenarios::Format::kF64 ? 0x1.0p-53 : 0x1.0p-24;
    std::vector<model::Projected<model::Real>> rows(static_cast<std::size_t>(keys));
    std::vector<model::EncodedRow> kenc(rows.size()), venc(rows.size());
    std::vector<std::vector<double>> kdev(rows.size()), kerr(rows.size());
    std::vector<const model::Projected<model::Real>*> ptrs;
    std::vector<KeyBounds> bounds;
    const std::int64_t bytes = format_row_bytes(ps.format, d);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      model::Row<model::Real> exact_k(k.begin() + static_cast<std::ptrdiff_t>(j) * d,
                                      k.begin() + static_cast<std::ptrdiff_t>(j + 1) * d);
      model::Row<model::Real> exact_v(v.begin() + static_cast<std::ptrdiff_t>(j) * d,
                                      v.begin() + static_cast<std::ptrdiff_t>(j + 1) * d);
      model::rope_rotate(exact_k, pos[j], rope);
      kenc[j] = model::encode_row(enc, exact_k);
      venc[j] = model::encode_row(enc, exact_v);
      key_deviations(exact_k, kenc[j], 1, d, pos[j], rope, enc, u, &kdev[j], &kerr[j]);
      rows[j].k.assign(kenc[j].values.begin(), kenc[j].values.end());
      rows[j].v.assign(venc[j].values.begin(), venc[j].values.end());
      ptrs.push_back(&rows[j]);
      bounds.push_back({&kenc[j].values, &kerr[j], &venc[j].values});
      // Stored rows: keys within the RoPE allowance, values bit for bit.
      std::vector<std::uint8_t> kb(static_cast<std::size_t>(bytes)), vb(static_cast<std::size_t>(bytes));
      std::vector<double> kd(static_cast<std::size_t>(d)), vd(static_cast<std::size_t>(d));
      REQUIRE(cpu.read_row_bytes(static_cast<std::int64_t>(j), kb.data(), vb.data()).ok());
      REQUIRE(cpu.read_row(static_cast<std::int64_t>(j), kd.data(), vd.data()).ok());
      INFO("p " << p << " base " << base << " format " << static_cast<int>(format) << " d " << d);
      CHECK(check_stored_row(enc, exact_k, kdev[j], kenc[j], kd.data(), kb.data()) == "");
      CHECK(check_stored_row(enc, exact_v, std::vector<double>(static_cast<std::size_t>(d), 0.0), venc[j],
                             vd.data(), vb.data()) == "");
      // The other direction: a float32 angle table, f64 rows, past 2^10.
      if (format == scenarios::Format::kF64 && p >= 1024 && d >= 8 && base >= 10 && base <= 1e6) {
        std::vector<double> bad(k.begin(), k.begin() + d);
        rotate(Flaw::kF32AngleTable, scenarios::Rope{scenarios::RopeStyle::kNeox, d, base}, pos[j],
               bad.data());
        ++float_angle_cases;
        float_angles_caught +=
            check_stored_row(enc, exact_k, kdev[j], kenc[j], bad.data(), nullptr).empty() ? 0 : 1;
      }
    }
    model::Row<model::Real> exact_q(q.begin(), q.end());
    model::rope_rotate(exact_q, p, rope);
    const model::Heads heads{1, 1, d, false};
    const auto ref = model::attend_heads(exact_q, ptrs, heads, model::Real(1) / sqrt(model::Real(d)));
    std::vector<double> ref_d(ref.size());
    for (std::size_t e = 0; e < ref.size(); ++e) ref_d[e] = model::to_double(ref[e]);
    KernelArithmetic arith;
    arith.u = u;
    ToleranceScratch scratch;
    const model::OutputTolerance tol = query_tolerance(exact_q, bounds, heads, 1.0 / std::sqrt(static_cast<double>(d)),
                                                       std::nullopt, p, rope, arith, ref_d, &scratch)
                                           .parts;
    double diff = 0;
    for (std::int32_t e = 0; e < d; ++e) {
      diff = std::max(diff, std::fabs(out[static_cast<std::size_t>(e)] -
                                      model::to_double(ref[static_cast<std::size_t>(e)])));
    }
    INFO("p " << p << " base " << base << " format " << static_cast<int>(format) << " d " << d << " diff "
              << diff << " tol " << tol.total() << " rope " << tol.rope);
    CHECK(diff <= tol.total());
    if (p == std::int64_t{1} << 40 && format == scenarios::Format::kF64)
      rope_tol_at_max = std::max(rope_tol_at_max, tol.rope);
    ++cases;
  }
  CHECK(cases == 240);
  CHECK(float_angle_cases > 10);
  CHECK(float_angles_caught == float_angle_cases);
  WARN("float32 angles caught in " << float_angles_caught << " of " << float_angle_cases
                                   << "; largest RoPE tolerance at p = 2^40, f64: " << rope_tol_at_max);
}

TEST_CASE("Numerics: the model's encoder and the CPU cache's agree byte for byte on random rows") {
  // Two encoders written apart (model/encoding.hpp from the formats' rules,
  // impl/element_format.hpp for the kernels): they must agree everywhere,
  // ties and subnormals included (values on a coarse grid make ties common).
  Prng rng(77);
  int rows = 0;
  for (int c = 0; c < 2000; ++c) {
    const std::int64_t n = 1 + static_cast<std::int64_t>(rng.next() % 70);
    const int exponent = static_cast<int>(rng.next() % 61) - 30;
    std::vector<double> x;
    for (std::int64_t i = 0; i < n; ++i) {
      const double grid = std::ldexp(std::round(rng.signed_unit() * 4096.0), exponent - 12);
      x.push_back(
          c % 2 == 0 ? grid : std::ldexp(rng.signed_unit(), exponent + static_cast<int>(rng.next() % 9) - 4));
    }
    for (auto f : {scenarios::Format::kF64, scenarios::Format::kF32, scenarios::Format::kBf16,
                   scenarios::Format::kFp8}) {
      const model::Encoding enc = static_cast<model::Encoding>(static_cast<int>(f));
      std::vector<std::uint8_t> theirs(static_cast<std::size_t>(format_row_bytes(f, n)));
      impl::encode_row(f, x.data(), n, theirs.data());
      INFO("row " << c << " format " << static_cast<int>(f));
      CHECK(model::encode_row(enc, x).bytes == theirs);
      ++rows;
    }
  }
  CHECK(rows == 8000);
}

TEST_CASE("Numerics: value profiles reach what breaks softmax and fp8 and replay from JSON") {
  // Uniform rows are the draw rows have always had (same seed, same rows).
  auto sc = long_prefill(300, 299, scenarios::Format::kF64, 8, 10000.0, 5);
  const RowSet uniform = make_rows(sc, 0, 0, 0, 3, 0);
  Prng rng(mix_seed(mix_seed(mix_seed(mix_seed(5, 0), 0), 0), 0));
  CHECK(uniform.k[0] == rng.signed_unit());
  // large-logits: a softmax without max-subtraction overflows and is caught;
  // the CPU ring pool and the correct naive cache pass, in every format.
  sc.data.profile = scenarios::ValueProfile::kLargeLogits;
  NaiveProvider no_shift(Flaw::kNoMaxSubtraction, true), good(Flaw::kCorrect, true);
  const auto bad = run_on(sc, &no_shift);
  CHECK_FALSE(bad.passed);
  CHECK(bad.output_failures > 0);
  auto plain = sc;
  plain.data.profile = scenarios::ValueProfile::kUniform;
  CHECK(run_on(plain, &no_shift).passed);  // small logits: the missing shift goes unseen
  for (auto f : {scenarios::Format::kF64, scenarios::Format::kF32, scenarios::Format::kBf16,
                 scenarios::Format::kFp8}) {
    sc.cache.format = f;
    const auto cpu = run_on(sc, nullptr);
    INFO(cpu.first_failure);
    CHECK(cpu.passed);
    CHECK(run_on(sc, &good).passed);
  }
  // fp8-outliers: block scales follow one outlier per block; stored rows
  // still match the reference bit for bit, and a scale x2 is caught.
  auto f8 = long_prefill(8, 40, scenarios::Format::kFp8, 64, 10000.0, 9);
  f8.data.profile = scenarios::ValueProfile::kFp8Outliers;
  const auto outliers = run_on(f8, nullptr);
  INFO(outliers.first_failure);
  CHECK(outliers.passed);
  CHECK(outliers.stored_rows_checked == 41);
  NaiveProvider twice(Flaw::kFp8ScaleTwice, false);
  CHECK_FALSE(run_on(f8, &twice).passed);  // values alone: the outliers push the others into subnormals
  // The profile travels in the scenario file.
  const auto text = scenarios::save_scenario(f8);
  CHECK(text.find("\"profile\": \"fp8-outliers\"") != std::string::npos);
  CHECK(scenarios::parse_scenario(text, "").data.profile == scenarios::ValueProfile::kFp8Outliers);
  CHECK(scenarios::save_scenario(plain).find("profile") == std::string::npos);
}

TEST_CASE("Numerics: generated cases draw each value profile") {
  Prng rng(3);
  scenarios::CacheConfig fp8;
  fp8.format = scenarios::Format::kFp8;
  int large = 0, outliers = 0;
  for (int i = 0; i < 800; ++i) {
    const auto p = draw_value_profile(fp8, rng);
    large += p == scenarios::ValueProfile::kLargeLogits ? 1 : 0;
    outliers += p == scenarios::ValueProfile::kFp8Outliers ? 1 : 0;
  }
  CHECK(large > 50);
  CHECK(outliers > 50);
  scenarios::CacheConfig f64;
  for (int i = 0; i < 200; ++i) CHECK(draw_value_profile(f64, rng) != scenarios::ValueProfile::kFp8Outliers);
}
