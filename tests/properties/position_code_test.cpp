// Position coding (properties/position_code.hpp): a cache that reports no
// slots is observed from its outputs like one that does. The decoder is
// checked against hand-made outputs (means of chosen rows' codes), the code
// against every format's encoding, and whole runs of the CPU ring pool with
// named faults, slots hidden, against the same runs with slots reported.
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>

#include "engines/factory.hpp"
#include "impl/kv_cache.hpp"
#include "model/encoding.hpp"
#include "properties/check.hpp"
#include "properties/generator.hpp"
#include "properties/position_code.hpp"
#include "properties/rows.hpp"
#include "properties/runner.hpp"

using namespace kvcheck;
using namespace kvcheck::properties;

namespace {

/// The CPU ring pool with its slots hidden: answers carry outputs only.
class HiddenSlotsCache final : public engines::CacheUnderTest {
 public:
  explicit HiddenSlotsCache(std::unique_ptr<engines::CacheUnderTest> inner) : inner_(std::move(inner)) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    const auto st = inner_->call(c, answer);
    if (!st && answer != nullptr) {
      answer->has_written = answer->has_reads = false;
      answer->written.clear();
      answer->read_slots.clear();
      answer->read_offsets.clear();
    }
    return st;
  }
  engines::StepStatus probe(const std::string& name, const engines::StepCall& context) override {
    return inner_->probe(name, context);
  }
  std::optional<std::uint64_t> fingerprint(std::int32_t layer) const override {
    return inner_->fingerprint(layer);
  }

 private:
  std::unique_ptr<engines::CacheUnderTest> inner_;
};

class HiddenSlotsProvider final : public engines::CacheProvider {
 public:
  explicit HiddenSlotsProvider(impl::Fault fault)
      : inner_(engines::make_provider("cpu", std::string(impl::fault_name(fault)))) {
    caps_ = inner_->capabilities();
    caps_.reports_written_slots = caps_.reports_read_slots = false;
    caps_.ring_addressing = false;
  }
  const engines::Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return "cpu-outputs-only"; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    auto inner = inner_->open(spec, refused);
    if (!inner) return nullptr;
    return std::make_unique<HiddenSlotsCache>(std::move(inner));
  }

 private:
  std::unique_ptr<engines::CacheProvider> inner_;
  engines::Capabilities caps_;
};

/// The mean of the value (or shared key) codes of `rows`, as a q = 0 query
/// of head 0's group sees it: out [q_heads * head_dim].
std::vector<double> mean_output(const scenarios::CacheConfig& c,
                                const std::vector<std::vector<double>>& values, double sink_weight = 0) {
  const std::int32_t group = c.q_heads / c.kv_heads;
  std::vector<double> out(static_cast<std::size_t>(c.q_heads) * c.head_dim, 0.0);
  const double z = static_cast<double>(values.size()) + sink_weight;
  for (std::int32_t h = 0; h < c.q_heads; ++h) {
    for (std::int32_t d = 0; d < c.head_dim; ++d) {
      double s = 0;
      for (const auto& v : values) s += v[static_cast<std::size_t>((h / group) * c.head_dim + d)];
      out[static_cast<std::size_t>(h * c.head_dim + d)] = s / z;
    }
  }
  return out;
}

/// The value code of the row `step` wrote at (request, position) on layer 0.
std::vector<double> code_of(const scenarios::CacheConfig& c, std::int64_t request, std::int64_t position,
                            std::int64_t step) {
  const PositionCodeLayout layout = position_code_layout(c);
  std::vector<double> k, v, q;
  Prng rng(1);
  position_code_row(c, layout, 0, request, position, step, rng, k, v, q);
  for (const double x : q) REQUIRE(x == 0.0);
  return c.shared_row ? k : v;
}

/// Per query with a finding: step, position and overwritten/missing/extra
/// counts, a missing row and an extra read paired into one overwritten row
/// (without slots a row read in a lost row's stead cannot be told from a row
/// read from another slot: README "Black-box engines").
std::string per_query(const RunObservation& run, bool sink) {
  std::string t;
  for (const auto& s : run.steps) {
    for (const auto& q : s.queries) {
      // Every visible row read twice is the same attention as each once (no
      // sink): invisible in the outputs, so not compared. (In a
      // load_then_store step the second read may be the old copy: compared.)
      std::size_t duplicates = 0;
      for (const auto& x : q.extra)
        duplicates += x.request == s.request && x.position >= q.visible_first && x.position <= q.position;
      const auto visible = static_cast<std::size_t>(q.position - q.visible_first + 1);
      const bool uniform = duplicates == visible && duplicates == q.extra.size() && q.missing.empty() &&
                           q.overwritten.empty() && s.order != "load_then_store";
      if (uniform && !sink) continue;
      const std::size_t paired = std::min(q.missing.size(), q.extra.size());
      const std::size_t o = q.overwritten.size() + paired, m = q.missing.size() - paired,
                        e = q.extra.size() - paired;
      if (o + m + e == 0) continue;
      t += "s" + std::to_string(s.step) + "p" + std::to_string(q.position) + ":" + std::to_string(o) + "/" +
           std::to_string(m) + "/" + std::to_string(e) + " ";
    }
  }
  return t;
}

std::int64_t lost(const RunObservation& run) {
  std::int64_t n = 0;
  for (const auto& s : run.steps)
    for (const auto& q : s.queries) n += static_cast<std::int64_t>(q.overwritten.size() + q.missing.size());
  return n;
}

std::int64_t extra(const RunObservation& run) {
  std::int64_t n = 0;
  for (const auto& s : run.steps)
    for (const auto& q : s.queries) n += static_cast<std::int64_t>(q.extra.size());
  return n;
}

}  // namespace

TEST_CASE("PositionCode: every format stores the code bit for bit") {
  for (const auto& [format, encoding] : {std::pair{scenarios::Format::kF64, model::Encoding::kF64},
                                         std::pair{scenarios::Format::kF32, model::Encoding::kF32},
                                         std::pair{scenarios::Format::kBf16, model::Encoding::kBf16},
                                         std::pair{scenarios::Format::kFp8, model::Encoding::kFp8}}) {
    scenarios::CacheConfig c;
    c.format = format;
    c.kv_heads = c.q_heads = 2;
    c.head_dim = 64;  // 128 elements: four fp8 scale blocks
    const PositionCodeLayout layout = position_code_layout(c);
    REQUIRE(layout.classes == 64);
    for (std::int64_t p = 0; p < 300; p += 7) {
      for (std::int64_t step = 0; step < 3; ++step) {
        const std::vector<double> v = code_of(c, 1, p, step);
        const auto enc = model::encode_row(encoding, v);
        INFO("format " << static_cast<int>(format) << " position " << p);
        REQUIRE(enc.values == v);
      }
    }
  }
}

TEST_CASE("PositionCode: shared rows with RoPE code only the unrotated dims, full RoPE codes nothing") {
  scenarios::CacheConfig c;
  c.shared_row = true;
  c.head_dim = 8;
  c.rope.style = scenarios::RopeStyle::kNeox;
  c.rope.rotary_dims = 4;
  const PositionCodeLayout partial = position_code_layout(c);
  REQUIRE(partial.classes == 2);
  for (const auto e : partial.elements) REQUIRE(e >= 4);
  c.rope.rotary_dims = 8;
  REQUIRE(position_code_layout(c).classes == 0);
  c.rope.style = scenarios::RopeStyle::kNone;
  REQUIRE(position_code_layout(c).classes == 4);
}

TEST_CASE("PositionCode: the decoder names the lost, stale and extra rows of hand-made outputs") {
  scenarios::CacheConfig c;
  c.head_dim = 8;
  c.kv_heads = 1;
  c.q_heads = 2;  // a group of two: head 0 shows the code
  c.format = scenarios::Format::kF32;
  PositionDecoder dec(c, 0);
  REQUIRE(dec.usable());
  // Request 0 writes positions 0..5 at step 0, then 4..5 again at step 1
  // (a rejected draft rewritten); request 1 writes 0..3 at step 2.
  dec.record_writes(0, 0, 6, 0);
  dec.record_writes(0, 4, 2, 1);
  dec.record_writes(1, 0, 4, 2);
  auto query = [&](std::int64_t first, std::int64_t p) {
    QueryObservation q;
    q.position = p;
    q.visible_first = first;
    return q;
  };
  // Visible 2..5 of request 0: the latest rows are step 0's 2, 3 and step 1's 4, 5.
  const auto r2 = code_of(c, 0, 2, 0), r3 = code_of(c, 0, 3, 0), r4 = code_of(c, 0, 4, 1),
             r5 = code_of(c, 0, 5, 1), stale4 = code_of(c, 0, 4, 0), r1 = code_of(c, 0, 1, 0),
             other3 = code_of(c, 1, 3, 2);

  SECTION("the right rows decode as right") {
    QueryObservation q = query(2, 5);
    dec.decode(0, mean_output(c, {r2, r3, r4, r5}).data(), &q);
    CHECK(q.overwritten.empty());
    CHECK(q.missing.empty());
    CHECK(q.extra.empty());
  }
  SECTION("a stale copy of a position is an overwritten row") {
    QueryObservation q = query(2, 5);
    dec.decode(0, mean_output(c, {r2, r3, stale4, r5}).data(), &q);
    CHECK(q.overwritten == std::vector<std::int64_t>{4});
    CHECK(q.missing.empty());
    CHECK(q.extra.empty());
  }
  SECTION("another request's row in a visible row's place is an overwritten row") {
    QueryObservation q = query(2, 5);
    dec.decode(0, mean_output(c, {r2, other3, r4, r5}).data(), &q);
    CHECK(q.overwritten == std::vector<std::int64_t>{3});
    CHECK(q.extra.empty());
  }
  SECTION("a row not read is missing, one read beyond the window is extra") {
    QueryObservation q = query(2, 5);
    dec.decode(0, mean_output(c, {r3, r4, r5}).data(), &q);
    CHECK(q.missing == std::vector<std::int64_t>{2});
    CHECK(q.overwritten.empty());
    QueryObservation w = query(2, 5);
    dec.decode(0, mean_output(c, {r1, r2, r3, r4, r5}).data(), &w);
    CHECK(w.missing.empty());
    REQUIRE(w.extra.size() == 1);
    CHECK(w.extra[0].request == 0);
    CHECK(w.extra[0].position == 1);
  }
  SECTION("a later row read twice in place of a lost one is an overwritten row") {
    QueryObservation q = query(2, 5);
    dec.decode(0, mean_output(c, {r5, r3, r4, r5}).data(), &q);
    CHECK(q.overwritten == std::vector<std::int64_t>{2});
    CHECK(q.extra.empty());
  }
  SECTION("with a sink logit the row count is pinned") {
    scenarios::CacheConfig s = c;
    s.sink_logit = 1.0;
    PositionDecoder sd(s, 0);
    sd.record_writes(0, 0, 6, 0);
    sd.record_writes(0, 4, 2, 1);
    QueryObservation q = query(2, 5);
    sd.decode(0, mean_output(s, {r2, r3, r4, r5, r2, r3, r4, r5}, std::exp(1.0)).data(), &q);
    // Every row read twice: without a sink that is invisible, with one the
    // four surplus reads are extra.
    CHECK(q.extra.size() == 4);
  }
  SECTION("outputs that are no mean of coded rows are an unknown extra read") {
    QueryObservation q = query(2, 5);
    std::vector<double> out = mean_output(c, {r2, r3, r4, r5});
    out[1] += 0.3;
    dec.decode(0, out.data(), &q);
    REQUIRE(!q.extra.empty());
    CHECK(q.extra.back().request == -1);
  }
}

TEST_CASE("PositionCode: an output-only ring pool reports the rows the slot-reporting one loses") {
  // Generated cases on position-coded rows, each under a named fault: the
  // verdict and the lost and extra rows per run are the same from outputs
  // alone as from reported slots, except where only a slot collision no
  // query reads again (README "Black-box engines") tells them apart.
  std::int64_t failing = 0, compared = 0, collision_only = 0, counted = 0, narrow = 0, narrow_agree = 0;
#if defined(KVCHECK_SANITIZED_TREE)
  constexpr std::int64_t kSeeds = 40;  // half under ASan (34 s for 80 seeds); the Release tree runs 80
#else
  constexpr std::int64_t kSeeds = 80;
#endif
  for (const impl::Fault fault :
       {impl::Fault::kNone, impl::Fault::kRingSizedWindow, impl::Fault::kWindowTooWide,
        impl::Fault::kWindowTooNarrow, impl::Fault::kSlotNoStateOffset, impl::Fault::kModuloWholePool,
        impl::Fault::kAcceptNoRollback, impl::Fault::kFreedStateReadable,
        impl::Fault::kStoreThenLoadPrefill}) {
    HiddenSlotsProvider hidden(fault);
    const auto plain = engines::make_provider("cpu", std::string(impl::fault_name(fault)));
    for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(kSeeds); ++seed) {
      auto sc = generate_scenario(case_seed(11, static_cast<std::int64_t>(seed)));
      sc.data.profile = scenarios::ValueProfile::kPositionCode;
      if (position_code_layout(sc.cache).classes == 0) continue;
      RunOptions a;
      a.provider = plain.get();
      a.fault = impl::fault_name(fault);
      a.probes = false;
      RunOptions b = a;
      b.provider = &hidden;
      const RunObservation ra = run_scenario(sc, a);
      const RunObservation rb = run_scenario(sc, b);
      INFO("fault " << impl::fault_name(fault) << " seed " << seed << ": " << ra.first_failure << " | "
                    << rb.first_failure);
      REQUIRE(rb.observed == "outputs+position-code");
      ++compared;
      if (lost(ra) == 0 && extra(ra) == 0 && !ra.passed && ra.collisions > 0) {
        // Only slots collided: the outputs may be right.
        ++collision_only;
        continue;
      }
      REQUIRE(ra.passed == rb.passed);
      failing += ra.passed ? 0 : 1;
      // Rows enough for every position a query can confuse to have a class
      // of its own: the counts agree query by query.
      const bool sink = sc.cache.sink_logit.has_value();
      std::int64_t rows = 1;
      for (const auto& st : sc.steps) rows = std::max(rows, scenarios::step_rows(st));
      if (position_code_layout(sc.cache).classes >= window_keys(sc.cache) + rows) {
        ++counted;
        CHECK(per_query(ra, sink) == per_query(rb, sink));
      } else {
        narrow_agree += per_query(ra, sink) == per_query(rb, sink) ? 1 : 0;
        ++narrow;
      }
    }
  }
  INFO("compared " << compared << ", collision-only " << collision_only << ", counted " << counted);
  std::printf(
      "position-code: %lld runs compared, %lld collision-only, %lld counted (all agree), %lld of %lld "
      "narrow-code runs agree\n",
      static_cast<long long>(compared), static_cast<long long>(collision_only),
      static_cast<long long>(counted), static_cast<long long>(narrow_agree), static_cast<long long>(narrow));
  // Per 80 seeds: more than 80 counted, 600 compared, 120 failing.
  CHECK(counted > kSeeds);
  REQUIRE(compared > kSeeds * 15 / 2);
  REQUIRE(failing > kSeeds * 3 / 2);  // the faults were really exercised
}
