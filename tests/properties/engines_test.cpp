// The step-level interface from the runner's side: observations come only
// from what a cache reports (slots are opaque integers), a cache that reports
// no slots is judged on outputs alone, the verdict is stored once and never
// disagrees with the steps, and refusal probes catch a cache that accepts
// what it must refuse or changes while refusing.
#include <catch2/catch.hpp>
#include <algorithm>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "engines/factory.hpp"
#include "impl/kv_cache.hpp"
#include "model/encoding.hpp"
#include "properties/agreement.hpp"
#include "properties/check.hpp"
#include "properties/generator.hpp"
#include "properties/runner.hpp"
#include "properties/shadow.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"

using namespace kvcheck;
using namespace kvcheck::properties;

namespace {

/// What a wrapper does to the inner cache's answers.
enum class Twist { kPermuteSlots, kNoSlots, kAcceptBadAccept, kChangeOnRefusal };

class TwistedCache final : public engines::CacheUnderTest {
 public:
  TwistedCache(std::unique_ptr<engines::CacheUnderTest> inner, Twist twist)
      : inner_(std::move(inner)), twist_(twist) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    if (twist_ == Twist::kAcceptBadAccept && c.op == engines::StepCall::Op::kStep &&
        c.step.kind == scenarios::StepKind::kAccept) {
      const auto st = inner_->call(c, answer);
      if (st && st->code == "bad-accept") return std::nullopt;  // swallows the refusal
      return st;
    }
    const auto st = inner_->call(c, answer);
    if (st && twist_ == Twist::kChangeOnRefusal) ++changes_;
    if (st || answer == nullptr) return st;
    if (twist_ == Twist::kPermuteSlots) {
      // A bijection onto large, scattered ids: nothing may depend on slot values.
      for (auto& s : answer->written) s = s * 7919 + 1000003;
      for (auto& s : answer->read_slots) s = s < 0 ? s : s * 7919 + 1000003;
    }
    if (twist_ == Twist::kNoSlots) {
      answer->has_written = answer->has_reads = false;
      answer->written.clear();
      answer->read_slots.clear();
      answer->read_offsets.clear();
    }
    return st;
  }
  std::optional<std::uint64_t> fingerprint(std::int32_t layer) const override {
    const auto f = inner_->fingerprint(layer);
    if (!f) return f;
    return *f + changes_;
  }

 private:
  std::unique_ptr<engines::CacheUnderTest> inner_;
  Twist twist_;
  std::uint64_t changes_ = 0;
};

class TwistedProvider final : public engines::CacheProvider {
 public:
  TwistedProvider(Twist twist, impl::Fault fault)
      : inner_(engines::make_provider("cpu", std::string(impl::fault_name(fault)))), twist_(twist) {
    caps_ = inner_->capabilities();
    if (twist == Twist::kPermuteSlots || twist == Twist::kNoSlots) caps_.ring_addressing = false;
    if (twist == Twist::kNoSlots) caps_.reports_written_slots = caps_.reports_read_slots = false;
  }
  const engines::Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return "twisted"; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    auto inner = inner_->open(spec, refused);
    if (!inner) return nullptr;
    return std::make_unique<TwistedCache>(std::move(inner), twist_);
  }

 private:
  std::unique_ptr<engines::CacheProvider> inner_;
  Twist twist_;
  engines::Capabilities caps_;
};

std::vector<std::int64_t> lost_per_step(const RunObservation& run) {
  std::vector<std::int64_t> out;
  for (const auto& s : run.steps) {
    std::int64_t n = 0;
    for (const auto& q : s.queries)
      n += static_cast<std::int64_t>(q.overwritten.size() + q.missing.size() + q.extra.size());
    out.push_back(n);
  }
  return out;
}

}  // namespace

TEST_CASE("Shadow map: slots are opaque integers, permuting them changes no observation") {
  // Generated cases with and without faults: the same lost rows per step and
  // the same verdict whether the slots are ring indices or scattered ids.
  std::int64_t failing = 0;
  for (const impl::Fault fault :
       {impl::Fault::kNone, impl::Fault::kWindowTooNarrow, impl::Fault::kRingSizedWindow,
        impl::Fault::kAcceptNoRollback, impl::Fault::kStoreThenLoadPrefill}) {
    TwistedProvider permuted(Twist::kPermuteSlots, fault);
    const auto plain = engines::make_provider("cpu", std::string(impl::fault_name(fault)));
    for (std::uint64_t seed = 1; seed <= 60; ++seed) {
      const auto sc = generate_scenario(case_seed(7, static_cast<std::int64_t>(seed)));
      RunOptions a;
      a.provider = plain.get();
      a.fault = impl::fault_name(fault);
      RunOptions b = a;
      b.provider = &permuted;
      const RunObservation ra = run_scenario(sc, a);
      const RunObservation rb = run_scenario(sc, b);
      INFO("fault " << impl::fault_name(fault) << " seed " << seed);
      REQUIRE(lost_per_step(ra) == lost_per_step(rb));
      // Writes outside the request's block are a ring notion only: the
      // opaque view counts every other collision the same.
      std::int64_t outside = 0;
      for (const auto& st : ra.steps) outside += st.collisions.outside_block;
      REQUIRE(ra.collisions - outside == rb.collisions);
      if (outside == 0) REQUIRE(ra.passed == rb.passed);
      failing += ra.passed ? 0 : 1;
    }
  }
  REQUIRE(failing > 20);  // the faults were really exercised
}

TEST_CASE("A cache that reports no slots is judged on outputs alone, and says so") {
  TwistedProvider blind(Twist::kNoSlots, impl::Fault::kNone);
  TwistedProvider blind_faulty(Twist::kNoSlots, impl::Fault::kWindowTooWide);
  std::int64_t caught = 0;
  for (std::uint64_t seed = 1; seed <= 80; ++seed) {
    const auto sc = generate_scenario(case_seed(3, static_cast<std::int64_t>(seed)));
    RunOptions o;
    o.provider = &blind;
    const RunObservation ok = run_scenario(sc, o);
    REQUIRE(ok.observed == "outputs");
    REQUIRE(ok.passed);
    REQUIRE(ok.lost_rows == 0);
    o.provider = &blind_faulty;
    const RunObservation bad = run_scenario(sc, o);
    REQUIRE(bad.lost_rows == 0);  // nothing to count without slots
    if (!bad.passed) {
      ++caught;
      REQUIRE(bad.output_failures > 0);
    }
  }
  REQUIRE(caught > 10);  // a window one key too wide changes outputs
}

TEST_CASE("Verdict: stored once, the run fails exactly when a step failed") {
  // Every bundled scenario and 300 generated cases, with every named fault.
  std::vector<scenarios::Scenario> scenarios_in;
  for (const auto& f : scenarios::collect_scenario_files(
           {(std::filesystem::path(KVCHECK_SOURCE_DIR) / "scenarios" / "fast").string()})) {
    scenarios_in.push_back(scenarios::load_scenario_file(f));
  }
  for (std::int64_t i = 0; i < 300; ++i) scenarios_in.push_back(generate_scenario(case_seed(11, i)));
  std::int64_t failed = 0, passed = 0;
  for (int f = 0; f < impl::kFaultCount; ++f) {
    RunOptions o;
    o.fault = impl::fault_name(static_cast<impl::Fault>(f));
    const auto provider = make_provider(o);
    o.provider = provider.get();
    for (std::size_t i = 0; i < scenarios_in.size(); i += (f == 0 ? 1 : 7)) {
      const RunObservation run = run_scenario(scenarios_in[i], o);
      bool any = false;
      for (const auto& s : run.steps) {
        bool q_any = false;
        for (const auto& q : s.queries) q_any = q_any || q.failed;
        if (q_any) REQUIRE(s.failed);
        any = any || s.failed;
      }
      INFO(run.scenario_name << " fault " << f << ": " << run.first_failure);
      REQUIRE(run.passed == !any);
      REQUIRE((run.first_failing_step >= 0) == any);
      if (any) REQUIRE(run.steps[static_cast<std::size_t>(run.first_failing_step)].failed);
      (run.passed ? passed : failed) += 1;
    }
  }
  REQUIRE(passed > 100);
  REQUIRE(failed > 50);
}

TEST_CASE("Verdict: verify-s128 expects its losses, so it passes and no step is marked failed") {
  const auto sc = scenarios::load_scenario_file(std::filesystem::path(KVCHECK_SOURCE_DIR) / "scenarios" /
                                                "fast" / "verify-s128.json");
  const RunObservation run = run_scenario(sc, RunOptions{});
  REQUIRE(run.passed);
  REQUIRE(run.first_failing_step == -1);
  REQUIRE(run.lost_rows == 15);
  for (const auto& s : run.steps) REQUIRE_FALSE(s.failed);
}

TEST_CASE("Refusal probes: a cache that accepts a bad accept, or changes while refusing, fails") {
  TwistedProvider lax(Twist::kAcceptBadAccept, impl::Fault::kNone);
  TwistedProvider leaky(Twist::kChangeOnRefusal, impl::Fault::kNone);
  std::int64_t lax_caught = 0, leaky_caught = 0, probes = 0;
  for (std::int64_t i = 0; i < 100; ++i) {
    const auto sc = generate_scenario(case_seed(5, i));
    RunOptions o;
    o.provider = &lax;
    const RunObservation a = run_scenario(sc, o);
    if (!a.passed) {
      ++lax_caught;
      REQUIRE(a.first_failure.find("accepted a call it must refuse") != std::string::npos);
    }
    o.provider = &leaky;
    const RunObservation b = run_scenario(sc, o);
    probes += b.probes;
    if (!b.passed) {
      ++leaky_caught;
      REQUIRE(b.first_failure.find("storage changed") != std::string::npos);
    }
  }
  REQUIRE(probes >= 100);
  REQUIRE(lax_caught > 10);
  REQUIRE(leaky_caught > 50);
}

TEST_CASE("Layer-bound cache: random schedules pass, its probes are refused with storage unchanged") {
  const auto provider = engines::make_provider("layer", "none");
  const auto caps = provider->capabilities();
  std::int64_t probes = 0, decodes = 0;
  for (std::int64_t i = 0; i < 150; ++i) {
    const auto sc = generate_scenario(case_seed(9, i), caps);
    std::string why;
    REQUIRE(caps.supports(sc, &why));
    RunOptions o;
    o.backend = "layer";
    o.provider = provider.get();
    const RunObservation run = run_scenario(sc, o);
    INFO(run.first_failure);
    REQUIRE_FALSE(run.skipped);
    REQUIRE(run.passed);
    probes += run.probes;
    decodes += run.queries;
  }
  REQUIRE(probes > 200);
  REQUIRE(decodes > 500);
}

TEST_CASE("Step semantics: one pure place for length and pending drafts") {
  using scenarios::StepKind;
  scenarios::RequestProgress p;
  auto step = [](StepKind k, std::int64_t rows = 0, std::int64_t drafts = 0, std::int64_t accepted = 0) {
    scenarios::Step s;
    s.kind = k;
    s.rows = rows;
    s.drafts = drafts;
    s.accepted = accepted;
    return s;
  };
  REQUIRE(scenarios::advance(p, step(StepKind::kPrefill, 5)) == scenarios::StepRefusal::kNone);
  REQUIRE(p.length == 5);
  REQUIRE(scenarios::advance(p, step(StepKind::kVerify, 0, 3)) == scenarios::StepRefusal::kNone);
  REQUIRE(p.speculative_length() == 9);
  REQUIRE(scenarios::advance(p, step(StepKind::kDecode)) == scenarios::StepRefusal::kWriteWhileVerifyPending);
  REQUIRE(scenarios::advance(p, step(StepKind::kAccept, 0, 0, 4)) == scenarios::StepRefusal::kAcceptTooMany);
  REQUIRE(p.speculative_length() == 9);  // unchanged by refusals
  REQUIRE(scenarios::advance(p, step(StepKind::kAccept, 0, 0, 1)) == scenarios::StepRefusal::kNone);
  REQUIRE(p.length == 7);
  REQUIRE(scenarios::advance(p, step(StepKind::kAccept, 0, 0, 0)) ==
          scenarios::StepRefusal::kAcceptWithoutVerify);
  REQUIRE(scenarios::advance(p, step(StepKind::kReset)) == scenarios::StepRefusal::kNone);
  REQUIRE(p == scenarios::RequestProgress{});
}

TEST_CASE(
    "Layer-bound cache: a stale revision is refused unchanged, then the cache is rebuilt and replayed") {
  const auto provider = engines::make_provider("layer", "none");
  scenarios::Scenario sc;
  sc.name = "layer-revision";
  sc.cache.window = sc.cache.ring_rows = 8;
  sc.cache.q_heads = sc.cache.kv_heads = 2;
  sc.cache.head_dim = 4;
  sc.cache.rope = scenarios::Rope{scenarios::RopeStyle::kNeox, 4, 10000.0};
  sc.requests = {{0, 0}};
  for (int i = 0; i < 6; ++i) {
    scenarios::Step d;
    d.kind = scenarios::StepKind::kDecode;
    sc.steps.push_back(d);
  }
  engines::Refusal refused;
  auto cache = provider->open(cache_spec(sc), &refused);
  REQUIRE(cache);
  std::vector<double> k(8, 0.25), v(8, 0.5), q(8, 1.0);
  engines::StepCall call;
  call.op = engines::StepCall::Op::kBegin;
  REQUIRE_FALSE(cache->call(call, nullptr));
  call.op = engines::StepCall::Op::kStep;
  call.step = sc.steps[0];
  call.rows = 1;
  call.k = k.data();
  call.v = v.data();
  call.q = q.data();
  engines::StepAnswer answer;
  for (int i = 0; i < 3; ++i) {
    k[0] = i;
    REQUIRE_FALSE(cache->call(call, &answer));
  }
  const auto before = cache->fingerprint(0);
  const auto st = cache->probe("stale-revision", call);
  REQUIRE(st);
  REQUIRE(st->code == "revision-mismatch");
  REQUIRE(cache->fingerprint(0) == before);
  // The next append goes to the rebuilt, replayed cache: position 3, reading 0..3.
  k[0] = 3;
  REQUIRE_FALSE(cache->call(call, &answer));
  REQUIRE(answer.written == std::vector<std::int64_t>{3});
  REQUIRE(answer.read_slots == std::vector<std::int64_t>{0, 1, 2, 3});
  // And random schedules with every probe (stale-revision included) still pass.
  RunOptions o;
  o.backend = "layer";
  o.provider = provider.get();
  const RunObservation run = run_scenario(sc, o);
  INFO(run.first_failure);
  REQUIRE(run.passed);
  REQUIRE(run.probes == 6);
}

// ---- Issue 18 item 9: where the generator used to never go ------------------

namespace {

/// A bug planted around a correct cache, at the step interface (the shipping
/// caches stay correct): what a cache with that bug answers.
enum class Planted {
  kKeepDraftsOnFinish,        ///< finish/reset leave a pending verify pending (the state's next request too)
  kCommitBeforeLateOverflow,  ///< a late overflow is detected after the key row was committed
  kRevisionOnlyWk,            ///< the revision check looks at Wk only
  kNoRevisionAfterReset,      ///< the revision check is skipped on a cache emptied by reset
};

class PlantedCache final : public engines::CacheUnderTest {
 public:
  PlantedCache(std::unique_ptr<engines::CacheUnderTest> inner, Planted bug)
      : inner_(std::move(inner)), bug_(bug) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    using scenarios::StepKind;
    if (bug_ == Planted::kKeepDraftsOnFinish && c.op == engines::StepCall::Op::kStep) {
      const StepKind kind = c.step.kind;
      if (kept_.contains(c.state) && scenarios::step_rows(c.step) > 0) {
        // The drafts it kept still await an accept: the cache refuses to write.
        return engines::Refusal{"verify-pending", "a verify of an earlier request awaits its accept"};
      }
      auto st = inner_->call(c, answer);
      if (st) return st;
      if (kind == StepKind::kVerify) pending_.insert(c.state);
      if (kind == StepKind::kAccept) pending_.erase(c.state);
      if ((kind == StepKind::kFinish || kind == StepKind::kReset) && pending_.erase(c.state) > 0) {
        kept_.insert(c.state);
      }
      return st;
    }
    if (c.op == engines::StepCall::Op::kStep) emptied_ = c.step.kind == scenarios::StepKind::kReset;
    return inner_->call(c, answer);
  }
  engines::StepStatus probe(const std::string& name, const engines::StepCall& c) override {
    auto st = inner_->probe(name, c);
    if (!st) return st;
    if (bug_ == Planted::kCommitBeforeLateOverflow && name == "late-overflow") {
      // The key (and value) row went into the cache before the score overflowed.
      engines::StepCall commit = c;
      commit.op = engines::StepCall::Op::kStep;
      inner_->call(commit, nullptr);
    }
    if (bug_ == Planted::kRevisionOnlyWk && name == "stale-revision" &&
        st->detail.find("update of Wk") == std::string::npos) {
      return std::nullopt;  // Wq, Wv or Wo changed: this cache does not look
    }
    if (bug_ == Planted::kNoRevisionAfterReset && name == "stale-revision" && emptied_) return std::nullopt;
    return st;
  }
  std::optional<std::uint64_t> fingerprint(std::int32_t layer) const override {
    return inner_->fingerprint(layer);
  }

 private:
  std::unique_ptr<engines::CacheUnderTest> inner_;
  Planted bug_;
  std::set<std::int64_t> pending_, kept_;
  bool emptied_ = false;
};

class PlantedProvider final : public engines::CacheProvider {
 public:
  PlantedProvider(const std::string& impl, Planted bug)
      : inner_(engines::make_provider(impl, "none")), bug_(bug) {}
  const engines::Capabilities& capabilities() override { return inner_->capabilities(); }
  std::string name() const override { return "planted"; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    auto inner = inner_->open(spec, refused);
    if (!inner) return nullptr;
    return std::make_unique<PlantedCache>(std::move(inner), bug_);
  }

 private:
  std::unique_ptr<engines::CacheProvider> inner_;
  Planted bug_;
};

struct Hunt {
  std::int64_t first_failing = -1;  ///< index of the first failing case, -1: none
  std::int64_t failing = 0;
  std::string first_failure;
};

/// Runs `cases` generated cases (default profile) on `provider`.
Hunt hunt(engines::CacheProvider& provider, const std::string& backend, std::uint64_t seed,
          std::int64_t cases) {
  Hunt h;
  const auto caps = provider.capabilities();
  for (std::int64_t i = 0; i < cases; ++i) {
    const auto sc = generate_scenario(case_seed(seed, i), caps);
    RunOptions o;
    o.backend = backend;
    o.provider = &provider;
    const RunObservation run = run_scenario(sc, o);
    if (run.passed) continue;
    ++h.failing;
    if (h.first_failing < 0) {
      h.first_failing = i;
      h.first_failure = run.first_failure;
    }
  }
  return h;
}

}  // namespace

TEST_CASE(
    "Generated schedules: a cache that keeps pending drafts past finish or reset fails within 100 cases") {
  // The generator finishes or resets requests whose verify is still pending
  // (docs/semantics.md "Steps": legal, the drafts are dropped); the bug keeps them, so the
  // state refuses its next write. A correct cache passes the same cases.
  PlantedProvider buggy("cpu", Planted::kKeepDraftsOnFinish);
  const Hunt h = hunt(buggy, "cpu", 1, 100);
  INFO(h.first_failure);
  REQUIRE(h.first_failing >= 0);
  CHECK(h.first_failing < 40);
  CHECK(h.failing >= 5);
  CHECK(h.first_failure.find("verify-pending") != std::string::npos);
  const auto correct = engines::make_provider("cpu", "none");
  CHECK(hunt(*correct, "cpu", 1, 100).failing == 0);
}

TEST_CASE("Layer-bound cache: the late-overflow probe fails after the projections and changes nothing") {
  const auto provider = engines::make_provider("layer", "none");
  scenarios::Scenario sc;
  sc.name = "layer-late-overflow";
  sc.cache.window = sc.cache.ring_rows = 8;
  sc.cache.q_heads = sc.cache.kv_heads = 2;
  sc.cache.head_dim = 4;
  sc.cache.rope = scenarios::Rope{scenarios::RopeStyle::kNeox, 4, 10000.0};
  sc.requests = {{0, 0}};
  engines::Refusal refused;
  auto cache = provider->open(cache_spec(sc), &refused);
  REQUIRE(cache);
  std::vector<double> k(8, 0.25), v(8, 0.5), q(8, 1.0);
  engines::StepCall call;
  call.op = engines::StepCall::Op::kBegin;
  REQUIRE_FALSE(cache->call(call, nullptr));
  call.op = engines::StepCall::Op::kStep;
  call.rows = 1;
  call.k = k.data();
  call.v = v.data();
  call.q = q.data();
  engines::StepAnswer answer;
  for (int i = 0; i < 3; ++i) REQUIRE_FALSE(cache->call(call, &answer));
  const auto before = cache->fingerprint(0);
  // Finite input (q and k of 1e200 pass the input check): the refusal is the
  // non-finite score, found in prepare, after the projections.
  const auto st = cache->probe("late-overflow", call);
  REQUIRE(st);
  CHECK(st->code == "non-finite");
  CHECK(cache->fingerprint(0) == before);
  REQUIRE_FALSE(cache->call(call, &answer));
  CHECK(answer.written == std::vector<std::int64_t>{3});
  // Successive stale-revision probes name Wq, Wk, Wv and Wo, all refused unchanged.
  std::set<std::string> updated;
  for (int i = 0; i < 4; ++i) {
    const auto b = cache->fingerprint(0);
    const auto s = cache->probe("stale-revision", call);
    REQUIRE(s);
    CHECK(s->code == "revision-mismatch");
    CHECK(cache->fingerprint(0) == b);
    updated.insert(s->detail.substr(s->detail.rfind(' ') + 1));
    REQUIRE_FALSE(cache->call(call, &answer));  // rebuilt and replayed
  }
  CHECK(updated == std::set<std::string>{"Wq)", "Wk)", "Wv)", "Wo)"});
}

TEST_CASE("Layer-bound cache: planted binding bugs fail its probes within 60 generated cases") {
  struct Row {
    Planted bug;
    const char* what;
  };
  for (const Row row : {Row{Planted::kCommitBeforeLateOverflow, "storage changed"},
                        Row{Planted::kRevisionOnlyWk, "stale-revision: the cache accepted"},
                        Row{Planted::kNoRevisionAfterReset, "stale-revision: the cache accepted"}}) {
    INFO(static_cast<int>(row.bug));
    PlantedProvider buggy("layer", row.bug);
    const Hunt h = hunt(buggy, "layer", 9, 60);
    INFO(h.first_failure);
    REQUIRE(h.first_failing >= 0);
    CHECK(h.first_failing < 30);
    CHECK(h.failing >= 3);
    CHECK(h.first_failure.find(row.what) != std::string::npos);
  }
}

TEST_CASE("StepKinds: a step of each kind writes the rows the table says, on the CPU pool and the layer cache") {
  // prefill(3), verify(2), accept(1), trim(2), decode, reset, decode, preempt, finish: every kind once
  // at least (preempt, which neither in-tree cache declares, left out below).
  const scenarios::StepKind kinds[] = {
      scenarios::StepKind::kPrefill, scenarios::StepKind::kVerify,  scenarios::StepKind::kAccept,
      scenarios::StepKind::kTrim,    scenarios::StepKind::kDecode,  scenarios::StepKind::kReset,
      scenarios::StepKind::kDecode,  scenarios::StepKind::kPreempt, scenarios::StepKind::kFinish};
  std::set<scenarios::StepKind> seen(std::begin(kinds), std::end(kinds));
  REQUIRE(seen.size() == std::size(scenarios::kStepKinds));
  for (const char* impl : {"cpu", "layer"}) {
    INFO(impl);
    const auto provider = engines::make_provider(impl, "none");
    scenarios::Scenario sc;
    sc.name = "every-kind";
    sc.cache.window = sc.cache.ring_rows = 16;
    sc.cache.head_dim = 4;
    sc.requests = {{0, 0}};
    const auto& caps = provider->capabilities();
    for (const auto kind : kinds) {
      scenarios::Step s;
      s.kind = kind;
      if (kind == scenarios::StepKind::kPrefill) s.rows = 3;
      if (kind == scenarios::StepKind::kVerify) s.drafts = 2;
      if (kind == scenarios::StepKind::kAccept) s.accepted = 1;
      if (kind == scenarios::StepKind::kTrim) s.positions = 2;
      // The steps the cache runs (the layer cache decodes one row at a time).
      if (caps.supports_step(s) && (caps.max_step_rows == 0 || scenarios::step_rows(s) <= caps.max_step_rows)) {
        sc.steps.push_back(s);
      }
    }
    engines::Refusal refused;
    auto cache = provider->open(cache_spec(sc), &refused);
    INFO(refused.code + ": " + refused.detail);
    REQUIRE(cache);
    engines::StepCall call;
    call.op = engines::StepCall::Op::kBegin;
    REQUIRE_FALSE(cache->call(call, nullptr));
    scenarios::RequestProgress progress;
    std::vector<double> rows(64, 0.5);
    int ran = 0;
    for (const auto& s : sc.steps) {
      INFO(scenarios::step_kind_name(s.kind));
      call.op = engines::StepCall::Op::kStep;
      call.step = s;
      call.position = scenarios::step_first_position(progress);
      call.rows = scenarios::step_rows(s);
      call.k = call.v = call.q = rows.data();
      engines::StepAnswer answer;
      REQUIRE_FALSE(cache->call(call, &answer));
      CHECK(static_cast<std::int64_t>(answer.written.size()) == scenarios::step_rows(s));
      CHECK(!answer.written.empty() == scenarios::step_kind_writes_rows(s.kind));
      REQUIRE(scenarios::advance(progress, s) == scenarios::StepRefusal::kNone);
      ++ran;
    }
    CHECK(ran >= 4);
  }
}

TEST_CASE("RingPool trim: the next write takes the trimmed slot, old rows stay visible, drafts are dropped") {
  using scenarios::StepKind;
  const auto step = [](StepKind kind, std::int64_t n = 0) {
    scenarios::Step s;
    s.kind = kind;
    if (kind == StepKind::kPrefill) s.rows = n;
    if (kind == StepKind::kVerify) s.drafts = n;
    if (kind == StepKind::kTrim) s.positions = n;
    return s;
  };
  // W = 3, S = 11: prefill 10 (positions 0..9), trim 7 -> L = 3; the decode at
  // 3 sees 1..3, rows written at the start (the runner must not have dropped
  // them: a trim reaches back past a window). verify(2) at 4, trimmed while
  // pending: its 3 rows go, then 1 more -> L = 3 again; decodes rewrite 3, 4.
  scenarios::Scenario sc;
  sc.name = "trim-rewind";
  sc.cache.window = 3;
  sc.cache.ring_rows = 11;
  sc.cache.head_dim = 4;
  sc.requests = {{0, 0}};
  sc.steps = {step(StepKind::kPrefill, 10), step(StepKind::kTrim, 7), step(StepKind::kDecode),
              step(StepKind::kVerify, 2),   step(StepKind::kTrim, 1), step(StepKind::kDecode),
              step(StepKind::kDecode)};
  properties::RunOptions options;
  const auto run = properties::run_scenario(sc, options);
  INFO(run.first_failure);
  REQUIRE(run.passed);
  // The decode after the first trim writes position 3 into slot 3, which held
  // the trimmed row of position 3, and reads the slots of 1, 2, 3.
  const auto& decode = run.steps[2];
  REQUIRE(decode.written_slots == std::vector<std::int64_t>{3});
  REQUIRE(decode.queries.size() == 1);
  CHECK(decode.queries[0].position == 3);
  CHECK(decode.queries[0].visible_first == 1);
  CHECK(decode.queries[0].overwritten.empty());
  CHECK(decode.queries[0].extra.empty());
  // After the verify's drafts are dropped and one more position trimmed, the
  // decodes write 3 and 4 again.
  CHECK(run.steps[5].first_position == 3);
  CHECK(run.steps[6].first_position == 4);

  // The pool refuses a trim past the committed length and changes nothing.
  const auto provider = engines::make_provider("cpu", "none");
  CHECK(provider->capabilities().trim);
  CHECK_FALSE(engines::make_provider("layer", "none")->capabilities().trim);
  engines::Refusal refused;
  auto cache = provider->open(cache_spec(sc), &refused);
  REQUIRE(cache);
  engines::StepCall call;
  call.op = engines::StepCall::Op::kBegin;
  REQUIRE_FALSE(cache->call(call, nullptr));
  call.op = engines::StepCall::Op::kStep;
  call.step = step(StepKind::kDecode);
  call.rows = 1;
  std::vector<double> rows(16, 0.5);
  call.k = call.v = call.q = rows.data();
  engines::StepAnswer answer;
  REQUIRE_FALSE(cache->call(call, &answer));
  const auto before = cache->fingerprint(0);
  call.step = step(StepKind::kTrim, 2);
  call.rows = 0;
  const auto st = cache->call(call, nullptr);
  REQUIRE(st);
  CHECK(st->code == "bad-argument");
  CHECK(cache->fingerprint(0) == before);
  call.step = step(StepKind::kTrim, 1);
  CHECK_FALSE(cache->call(call, nullptr));
}

TEST_CASE(
    "Generator: trims are drawn for a cache that declares them, in every case under the trim profile and in "
    "some by default, never for one that does not") {
  engines::Capabilities caps;  // every capability on, trim included
  engines::Capabilities no_trim;
  no_trim.trim = false;
  properties::Coverage reached;
  int trims = 0, trims_default = 0;
  const auto has_trim = [](const scenarios::Scenario& sc) {
    return std::any_of(sc.steps.begin(), sc.steps.end(),
                       [](const scenarios::Step& s) { return s.kind == scenarios::StepKind::kTrim; });
  };
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    const auto plain = properties::generate_scenario(seed, caps);
    const auto with = properties::generate_scenario(seed, caps, properties::Profile::kTrim);
    auto without = properties::generate_scenario(seed, no_trim, properties::Profile::kTrim);
    const auto without_default = properties::generate_scenario(seed, no_trim);
    CHECK_FALSE(has_trim(without));
    CHECK_FALSE(has_trim(without_default));
    // Without trim the trim profile is the default's case under another name.
    without.name = without_default.name;
    without.description = without_default.description;
    CHECK(without == without_default);
    trims += has_trim(with) ? 1 : 0;
    trims_default += has_trim(plain) ? 1 : 0;
    const auto cov = properties::classify(with, caps);
    CHECK(cov.features[static_cast<std::size_t>(properties::Feature::kTrim)] == has_trim(with));
    reached.write_after_trim = reached.write_after_trim || cov.write_after_trim;
    reached.trim_with_drafts_pending = reached.trim_with_drafts_pending || cov.trim_with_drafts_pending;
    if (seed <= 25) {
      properties::RunOptions options;
      for (const auto* sc : {&with, &plain}) {
        const auto run = properties::run_scenario(*sc, options);
        INFO(sc->name << ": " << run.first_failure);
        CHECK(run.passed);
      }
    }
  }
  CHECK(trims >= 45);
  CHECK(trims_default >= 15);
  CHECK(trims_default < trims);
  CHECK(reached.write_after_trim);
  CHECK(reached.trim_with_drafts_pending);
  const auto& names = properties::coverage_names();
  const std::size_t trim_class = properties::feature_class(properties::Feature::kTrim);
  CHECK(names[trim_class] == "feature:trim");
  CHECK(names[12] == "trim_with_drafts_pending");
  for (const auto profile : {properties::Profile::kDefault, properties::Profile::kTrim}) {
    CHECK_FALSE(properties::reachable_coverage(no_trim, profile)[trim_class]);
    CHECK_FALSE(properties::reachable_coverage(no_trim, profile)[12]);
    CHECK(properties::reachable_coverage(caps, profile)[trim_class]);
    CHECK(properties::reachable_coverage(caps, profile)[12]);
  }
}

TEST_CASE("Generator: the prefix profile draws shared prefixes in every case for a cache that shares them, the others none") {
  engines::Capabilities caps;  // every capability on; prefix sharing is off by default
  caps.prefix_sharing = true;
  const engines::Capabilities plain_caps;
  properties::Coverage reached;
  int shared = 0;
  for (std::uint64_t seed = 1; seed <= 80; ++seed) {
    const auto plain = properties::generate_scenario(seed, plain_caps);
    auto without = properties::generate_scenario(seed, plain_caps, properties::Profile::kPrefix);
    const auto with = properties::generate_scenario(seed, caps, properties::Profile::kPrefix);
    for (const auto& r : plain.requests) CHECK_FALSE(r.prefix);
    // Without prefix sharing the prefix profile is the default's case under another name.
    without.name = plain.name;
    without.description = plain.description;
    CHECK(without == plain);
    std::string why;
    CHECK_FALSE(plain_caps.supports(with, &why) == std::any_of(with.requests.begin(), with.requests.end(),
                                                               [](const scenarios::Request& r) { return bool(r.prefix); }));
    shared += std::any_of(with.requests.begin(), with.requests.end(),
                          [](const scenarios::Request& r) { return bool(r.prefix); });
    caps.block_size = 4;
    const auto cov = properties::classify(with, caps);
    caps.block_size = 0;
    reached.prefix_of_live = reached.prefix_of_live || cov.prefix_of_live;
    reached.prefix_of_finished = reached.prefix_of_finished || cov.prefix_of_finished;
    reached.cow_write_into_shared_block = reached.cow_write_into_shared_block || cov.cow_write_into_shared_block;
    reached.window_free_of_shared_block = reached.window_free_of_shared_block || cov.window_free_of_shared_block;
  }
  CHECK(shared >= 25);
  CHECK(reached.prefix_of_live);
  CHECK(reached.prefix_of_finished);
  CHECK(reached.cow_write_into_shared_block);
  CHECK(reached.window_free_of_shared_block);
  const auto& names = properties::coverage_names();
  CHECK(names[21] == "window_free_of_shared_block");
  for (const auto profile : {properties::Profile::kDefault, properties::Profile::kPrefix}) {
    CHECK(properties::reachable_coverage(plain_caps, profile)[21] == false);
    CHECK(properties::reachable_coverage(caps, profile)[21] == true);
    // A copy-on-write into the block a prefix ends in needs blocks of two rows or more.
    CHECK(names[20] == "cow_write_into_shared_block");
    CHECK_FALSE(properties::reachable_coverage(caps, profile)[20]);
    engines::Capabilities paged = caps;
    paged.block_size = 4;
    CHECK(properties::reachable_coverage(paged, profile)[20]);
  }
}

TEST_CASE("Generator: pool pressure is drawn for a cache that shares prefixes and reports cached rows, never for the others") {
  engines::Capabilities sharing;  // shares prefixes, keeps no cached rows
  sharing.prefix_sharing = true;
  sharing.block_size = 4;
  engines::Capabilities cached = sharing;
  cached.reports_cached = true;
  const auto pressure = static_cast<std::size_t>(properties::Feature::kPoolPressure);
  CHECK_FALSE(properties::drawable_features(sharing, properties::Profile::kDefault)[pressure]);
  CHECK(properties::drawable_features(cached, properties::Profile::kDefault)[pressure]);
  CHECK_FALSE(properties::drawable_features(cached, properties::Profile::kProduction)[pressure]);
  // cached_block_evicted and begin_from_evicted_prefix, the last schedule classes.
  for (const std::size_t k : {std::size_t{23}, std::size_t{24}}) {
    CHECK_FALSE(properties::reachable_coverage(sharing)[k]);
    CHECK(properties::reachable_coverage(cached)[k]);
  }
  int exercised = 0, with = 0, block_prefixes = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    exercised += properties::exercised_features(properties::generate_scenario(seed, sharing))[pressure] ? 1 : 0;
    const auto sc = properties::generate_scenario(seed, cached);
    if (!properties::exercised_features(sc)[pressure]) continue;
    ++with;
    for (const auto& r : sc.requests) block_prefixes += r.prefix && r.prefix->positions % 4 == 0 ? 1 : 0;
  }
  // The part draws the cases (without it the same structure is rare), and
  // its begins are from whole blocks of finished requests.
  CHECK(with >= 60);
  CHECK(with >= 3 * exercised);
  CHECK(block_prefixes >= with);
}

namespace {

/// Opens every layer with layer 0's window: the per-layer window taken from
/// the wrong layer, planted in the CPU ring pool (which runs one pool per
/// layer, each with its own window).
class LayerZeroWindowProvider final : public engines::CacheProvider {
 public:
  LayerZeroWindowProvider() : inner_(engines::make_provider("cpu", "none")) {}
  const engines::Capabilities& capabilities() override { return inner_->capabilities(); }
  std::string name() const override { return "layer-zero-window"; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    engines::CacheSpec swapped = spec;
    for (auto& keys : swapped.layer_window_keys) keys = spec.layer_window_keys.front();
    return inner_->open(swapped, refused);
  }

 private:
  std::unique_ptr<engines::CacheProvider> inner_;
};

}  // namespace

TEST_CASE("Layer windows: each layer's queries see their own window: layer 0's window for all fails") {
  const auto sc = scenarios::load_scenario_file(std::filesystem::path(KVCHECK_SOURCE_DIR) / "scenarios" / "fast" /
                                                "layer-windows-w2-global-left3.json");
  RunOptions o;
  const RunObservation good = run_scenario(sc, o);
  INFO(good.first_failure << good.skip_reason);
  REQUIRE_FALSE(good.skipped);
  CHECK(good.passed);
  CHECK(good.layer_window_keys == std::vector<std::int64_t>{2, 0, 4});  // 0: the global layer
  // The reference's visible range per layer at the last query (position 8):
  // 2 keys from 7, every position from 0, 4 keys (left 3) from 5.
  std::map<std::int32_t, std::int64_t> first_at_8;
  for (const auto& s : good.steps) {
    for (const auto& q : s.queries)
      if (q.position == 8) first_at_8[s.layer] = q.visible_first;
  }
  CHECK(first_at_8 == std::map<std::int32_t, std::int64_t>{{0, 7}, {1, 0}, {2, 5}});

  LayerZeroWindowProvider swapped;
  o.provider = &swapped;
  const RunObservation bad = run_scenario(sc, o);
  CHECK_FALSE(bad.passed);
  std::set<std::int32_t> failing_layers;
  for (const auto& s : bad.steps)
    if (s.failed) failing_layers.insert(s.layer);
  CHECK(failing_layers == std::set<std::int32_t>{1, 2});  // layer 0 has its own window

  // A cache that does not declare per-layer windows is never given the scenario.
  o.provider = nullptr;
  o.backend = "layer";
  const RunObservation skipped = run_scenario(sc, o);
  CHECK(skipped.skipped);
  CHECK(skipped.skip_reason.find("cache.layer_windows") != std::string::npos);
}

TEST_CASE("Generator: the layers profile mixes sliding and global layers in every case for a cache that declares them, the default in some") {
  engines::Capabilities caps;
  caps.per_layer_windows = true;
  const engines::Capabilities plain_caps;  // per_layer_windows off by default
  properties::Coverage reached;
  int layered = 0, global = 0, plain_layered = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    const auto plain = properties::generate_scenario(seed, caps);
    plain_layered += plain.cache.layer_windows.empty() ? 0 : 1;
    auto without = properties::generate_scenario(seed, plain_caps, properties::Profile::kLayers);
    without.name = plain.name;
    without.description = plain.description;
    CHECK(without == properties::generate_scenario(seed, plain_caps));
    const auto with = properties::generate_scenario(seed, caps, properties::Profile::kLayers);
    REQUIRE(with.cache.layer_windows.size() == static_cast<std::size_t>(with.cache.layers));
    CHECK(with.cache.layers >= 2);
    CHECK(with.cache.layer_windows[0] != with.cache.layer_windows[1]);
    layered += 1;
    if (scenarios::has_global_layer(with.cache)) {
      ++global;
      CHECK(with.cache.ring_rows >= scenarios::schedule_end(with.steps));
    }
    const auto cov = properties::classify(with, caps);
    reached.sliding_and_global_layers = reached.sliding_and_global_layers || cov.sliding_and_global_layers;
    reached.sliding_windows_differ = reached.sliding_windows_differ || cov.sliding_windows_differ;
    if (seed <= 20) {
      properties::RunOptions options;
      const auto run = properties::run_scenario(with, options);
      INFO(with.name << ": " << run.first_failure << run.skip_reason);
      CHECK_FALSE(run.skipped);
      CHECK(run.passed);
    }
  }
  CHECK(layered == 60);
  CHECK(global >= 20);
  CHECK(global <= 58);
  CHECK(reached.sliding_and_global_layers);
  CHECK(reached.sliding_windows_differ);
  // By default a window per layer is drawn in some cases, not all.
  CHECK(plain_layered >= 15);
  CHECK(plain_layered <= 45);
  CHECK(properties::coverage_names()[17] == "sliding_windows_differ");
  CHECK(properties::reachable_coverage(plain_caps, properties::Profile::kLayers)[17] == false);
  CHECK(properties::reachable_coverage(caps, properties::Profile::kDefault)[17] == true);
}

namespace {

/// The CPU ring pool with capabilities `declare` edits, each cache it opens
/// wrapped by `wrap` (given the spec it was opened with): what the wrapping
/// caches below do, declared as they say.
class WrappedCpuProvider final : public engines::CacheProvider {
 public:
  using Wrap = std::function<std::unique_ptr<engines::CacheUnderTest>(
      std::unique_ptr<engines::CacheUnderTest>, const engines::CacheSpec&)>;
  WrappedCpuProvider(std::string name, const std::function<void(engines::Capabilities&)>& declare, Wrap wrap)
      : inner_(engines::make_provider("cpu", "none")), name_(std::move(name)), wrap_(std::move(wrap)) {
    caps_ = inner_->capabilities();
    declare(caps_);
  }
  const engines::Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return name_; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    auto inner = inner_->open(spec, refused);
    return inner ? wrap_(std::move(inner), spec) : nullptr;
  }

 private:
  std::unique_ptr<engines::CacheProvider> inner_;
  std::string name_;
  Wrap wrap_;
  engines::Capabilities caps_;
};

/// The CPU ring pool declaring a resident bound of rows in all (`limit` 0:
/// states * capacity, which a ring never exceeds) and, with `free_previous`,
/// freeing at each decode the slot of the request's previous row, which its
/// next query still sees.
class BoundedCache final : public engines::CacheUnderTest {
 public:
  BoundedCache(std::unique_ptr<engines::CacheUnderTest> inner, bool free_previous)
      : inner_(std::move(inner)), free_previous_(free_previous) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    const auto st = inner_->call(c, answer);
    if (st || answer == nullptr || !answer->has_written || c.op != engines::StepCall::Op::kStep) return st;
    const auto it = last_.find(c.step.request);
    if (free_previous_ && c.step.kind == scenarios::StepKind::kDecode && it != last_.end()) {
      answer->freed.push_back(it->second);
    }
    last_[c.step.request] = answer->written.back();
    return st;
  }

 private:
  std::unique_ptr<engines::CacheUnderTest> inner_;
  bool free_previous_;
  std::map<std::int64_t, std::int64_t> last_;  // request -> slot of its last row
};

/// The CPU ring pool declaring a resident bound of `limit` rows and its frees.
WrappedCpuProvider bounded_provider(std::int64_t limit, bool free_previous) {
  return WrappedCpuProvider(
      "bounded",
      [limit](engines::Capabilities& caps) {
        caps.reports_frees = true;
        caps.resident_bound.unit = engines::ResidentBound::Unit::kRows;
        caps.resident_bound.limit = limit;
      },
      [free_previous](std::unique_ptr<engines::CacheUnderTest> inner, const engines::CacheSpec&) {
        return std::make_unique<BoundedCache>(std::move(inner), free_previous);
      });
}

/// Rows 0 .. n-1 of request 0 at slots 0 .. n-1 (a store_then_load prefill,
/// each query reading the slots up to its own).
void write_rows(ShadowMap& shadow, std::int64_t n, std::int64_t keys) {
  std::vector<std::int64_t> written, offsets{0}, reads;
  for (std::int64_t i = 0; i < n; ++i) {
    written.push_back(i);
    for (std::int64_t j = std::max<std::int64_t>(0, i - keys + 1); j <= i; ++j) reads.push_back(j);
    offsets.push_back(static_cast<std::int64_t>(reads.size()));
  }
  StepFacts f;
  f.rows = n;
  f.window_keys = keys;
  f.has_written = f.has_reads = true;
  f.written = written;
  f.read_offsets = offsets;
  f.read_slots = reads;
  StepObservation obs;
  shadow.observe(f, &obs);
  for (const auto& q : obs.queries) REQUIRE(reads_correct(q));
}

/// One row of `request` at position `p` written at `slot`, its query
/// reading `reads`, with the step's moves and padding; returns the step's
/// observation.
StepObservation one_row_step(ShadowMap& shadow, std::int64_t request, std::int64_t p, std::int64_t slot,
                             const std::vector<std::int64_t>& reads, std::int64_t keys,
                             const std::vector<std::pair<std::int64_t, std::int64_t>>& moved = {},
                             const std::vector<std::int64_t>& padded = {}) {
  const std::vector<std::int64_t> written{slot};
  const std::vector<std::int64_t> offsets{0, static_cast<std::int64_t>(reads.size())};
  StepFacts f;
  f.request = request;
  f.first_position = p;
  f.rows = 1;
  f.window_keys = keys;
  f.has_written = f.has_reads = true;
  f.written = written;
  f.read_offsets = offsets;
  f.read_slots = reads;
  f.moved = moved;
  f.padded = padded;
  StepObservation obs;
  shadow.observe(f, &obs);
  return obs;
}

/// A decode of position `p` (of `request`) written at `slot`, its query
/// reading `reads`, with the step's moves and padding; returns its query's
/// observation.
QueryObservation decode(ShadowMap& shadow, std::int64_t p, std::int64_t slot, std::vector<std::int64_t> reads,
                        std::int64_t keys, std::vector<std::pair<std::int64_t, std::int64_t>> moved = {},
                        std::vector<std::int64_t> padded = {}, std::int64_t request = 0) {
  const StepObservation obs = one_row_step(shadow, request, p, slot, reads, keys, moved, padded);
  REQUIRE(obs.queries.size() == 1);
  return obs.queries[0];
}

}  // namespace

TEST_CASE("Shadow map: padding on a live row is an overwritten row, padding elsewhere is nothing") {
  // Window 3: the query at 3 sees positions 1, 2, 3 (slots 1, 2, 3).
  ShadowMap clean;
  write_rows(clean, 3, 3);
  CHECK(reads_correct(decode(clean, 3, 3, {1, 2, 3}, 3, {}, {100, 101})));  // scratch slots
  CHECK(clean.at(100).padding);
  CHECK(clean.resident_counts(0).rows == 4);  // padding is not a row

  ShadowMap through;
  write_rows(through, 3, 3);
  const QueryObservation q = decode(through, 3, 3, {1, 2, 3}, 3, {}, {1});  // over position 1
  CHECK(q.overwritten == std::vector<std::int64_t>{1});
  CHECK(q.missing.empty());
  CHECK(q.extra.empty());  // the read of slot 1 is position 1's, which it lost
  REQUIRE(q.reads.size() == 3);
  CHECK(q.reads[0].position == -1);  // what the slot held: padding
}

TEST_CASE("Shadow map: rows follow their moves: a move that drops a visible row loses it") {
  // A rolling cache of 3 slots: each decode shifts the rows one slot down
  // (1 -> 0, then 2 -> 1) and writes the new row at slot 2.
  ShadowMap rolling;
  write_rows(rolling, 3, 3);
  CHECK(reads_correct(decode(rolling, 3, 2, {0, 1, 2}, 3, {{1, 0}, {2, 1}})));
  CHECK(reads_correct(decode(rolling, 4, 2, {0, 1, 2}, 3, {{1, 0}, {2, 1}})));
  CHECK(rolling.at(0).position == 2);

  // The same shift in the wrong order copies position 2 twice and drops 1.
  ShadowMap wrong;
  write_rows(wrong, 3, 3);
  const QueryObservation q = decode(wrong, 3, 2, {0, 1, 2}, 3, {{2, 1}, {1, 0}});
  CHECK(q.overwritten == std::vector<std::int64_t>{1});
  CHECK(q.missing.empty());

  // Released slots hold nothing; a visible row released is returned.
  ShadowMap freed;
  write_rows(freed, 4, 2);
  const std::vector<std::int64_t> slots{0, 3}, keep;
  const auto lost = freed.release(slots, keep, [](const ShadowRow& r) { return r.position >= 2; });
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].position == 3);
  CHECK(freed.at(0).request < 0);
  CHECK(freed.resident_counts(2).rows == 2);
  CHECK(freed.resident_counts(2).blocks == 2);  // slots 1 and 2: blocks 0 and 1 of two slots
  CHECK(freed.resident_counts(4).blocks == 1);
  // A slot the step wrote keeps its row while it is visible (freed before
  // the write), and is emptied without a count when it is not.
  const std::vector<std::int64_t> written{1, 2};
  CHECK(freed.release(written, written, [](const ShadowRow& r) { return r.position == 2; }).empty());
  CHECK(freed.at(1).request < 0);
  CHECK(freed.at(2).position == 2);
}

namespace {

/// A decode of `request` at position `p` written at `slot`, reading `reads`
/// (window `keys`), after the step's moves.
QueryObservation decode_of(ShadowMap& shadow, std::int64_t request, std::int64_t p, std::int64_t slot,
                           std::vector<std::int64_t> reads, std::int64_t keys,
                           std::vector<std::pair<std::int64_t, std::int64_t>> moved = {}) {
  return decode(shadow, p, slot, std::move(reads), keys, std::move(moved), {}, request);
}

}  // namespace

TEST_CASE("Shadow map: prefix rows left to a step are absent until it stores them, then the source's rows") {
  // Request 0 wrote positions 0..4 at slots 0..4 (keys 3); request 1 begins
  // from them, sharing 0..1 and leaving 2..4 to its first step (recompute).
  const std::vector<std::int64_t> none, left{2, 3, 4};
  ShadowMap m;
  write_rows(m, 5, 3);
  ShadowMap::PrefixTally tally;
  m.begin_prefix(1, 0, 5, none, 3, &tally, 0, left);
  CHECK(tally.held_positions == 2);  // 0 and 1 shared; the left positions are no prefix hit
  // Not stored yet: reading the source's own slots for them is correct by
  // lineage (the content is there), but a position no slot stands in for
  // is missing: the source's slot 4 overwritten first.
  ShadowMap gone = m;
  decode_of(gone, 0, 5, 4, {3, 4}, 3);  // request 0's next row takes slot 4
  const QueryObservation missing = decode_of(gone, 1, 5, 20, {3, 4, 20}, 3);
  CHECK(missing.missing == std::vector<std::int64_t>{4});
  // Stored by the step: rows of request 1 holding request 0's content, read correctly.
  const std::vector<std::pair<std::int64_t, std::int64_t>> stored{{2, 12}, {3, 13}, {4, 14}};
  std::int64_t evicted = 0;
  const std::vector<std::uint64_t> seqs = m.recompute(1, stored, &evicted);
  REQUIRE(seqs.size() == 3);
  CHECK(seqs[0] > 0);
  CHECK(seqs[1] == seqs[0] + 1);
  CHECK(evicted == 0);
  CHECK(m.at(14).request == 1);
  CHECK(m.at(14).position == 4);
  CHECK(m.at(14).origin_request == 0);  // the source's row by lineage
  CHECK(m.at(14).origin == m.at(4).origin);
  CHECK(reads_correct(decode_of(m, 1, 5, 20, {13, 14, 20}, 3)));
  // The rows are request 1's from then on: the source overwriting its own
  // slot 4 no longer touches what request 1 reads.
  CHECK(reads_correct(decode_of(m, 1, 6, 21, {14, 20, 21}, 3)));
}

TEST_CASE("Shadow map: a shared prefix is one row of two requests: changed under a sharer it is overwritten, evicted it is missing") {
  // Request 0 wrote positions 0..2 at slots 0..2; request 1 begins from them.
  const std::vector<std::int64_t> none;
  ShadowMap shared;
  write_rows(shared, 3, 3);
  CHECK(shared.begin_prefix(1, 0, 3, none) == std::vector<std::uint64_t>{0, 0, 0});
  CHECK(reads_correct(decode_of(shared, 1, 3, 10, {1, 2, 10}, 3)));
  CHECK_FALSE(reads_correct(decode_of(shared, 1, 4, 11, {1, 10, 11}, 3)));  // position 2 not read: missing

  // The source writes into a shared slot (no copy-on-write): the sharer's
  // row changed under it.
  ShadowMap under;
  write_rows(under, 3, 3);
  under.begin_prefix(1, 0, 3, none);
  decode_of(under, 0, 3, 2, {2}, 1);
  const QueryObservation q = decode_of(under, 1, 3, 20, {1, 2, 20}, 3);
  CHECK(q.overwritten == std::vector<std::int64_t>{2});
  CHECK(q.missing.empty());

  // Copy-on-write: the shared rows copied (moved) into the sharer's block
  // read back as its own; the pool counts them, each request holds one block.
  ShadowMap cow;
  write_rows(cow, 3, 3);
  cow.begin_prefix(1, 0, 3, none);
  CHECK(reads_correct(decode_of(cow, 1, 3, 7, {5, 6, 7}, 3, {{0, 4}, {1, 5}, {2, 6}})));
  CHECK(reads_correct(decode_of(cow, 0, 3, 3, {1, 2, 3}, 3)));
  CHECK(cow.resident_counts(4).rows == 8);
  CHECK(cow.resident_counts(4).blocks == 2);
  CHECK(cow.resident_counts(4).request_blocks == 1);

  // Resident per request: request 0 wrote positions 0..9 (blocks of 4 at
  // slots 0..9), request 1 began from its first 4 (block 0, shared); request
  // 0's window (3 keys, next query at 10) left blocks 0 and 1 and the cache
  // freed block 1, but block 0 stays for request 1 (next query at 4, sees 2..).
  // Block 0 is request 1's, not its writer's: each request holds one block.
  ShadowMap left;
  write_rows(left, 10, 3);
  left.begin_prefix(1, 0, 4, none);
  const std::vector<std::int64_t> block1{4, 5, 6, 7};
  left.release(block1, none, [](const ShadowRow&) { return false; });
  const auto sees = [](std::int64_t sharer_from) {
    return [sharer_from](const ShadowRow& r) { return r.position >= (r.request == 0 ? 8 : sharer_from); };
  };
  const auto live_both = [](std::int64_t) { return true; };
  const auto live_writer = [](std::int64_t request) { return request == 0; };
  CHECK(left.resident_counts(4).request_blocks == 2);  // no visibility given: every request sees every row
  CHECK(left.resident_counts(4, sees(2), live_both).blocks == 2);
  CHECK(left.resident_counts(4, sees(2), live_both).request_blocks == 1);
  // Rows 0 and 1 none sees: held by their writer (rows), block 0 by its sharer.
  CHECK(left.resident_counts(4, sees(2), live_both).request_rows == 4);
  // Request 1 finished: a prefix cache keeps block 0 for it, still one each.
  CHECK(left.resident_counts(4, sees(100), live_writer).request_blocks == 1);
  // Request 1 live but past block 0: none holds it, so its writer does (a
  // cache keeping a block past every window keeps it for the request that wrote it).
  CHECK(left.resident_counts(4, sees(100), live_both).request_blocks == 2);

  // Evicted before the begin: position 0 is in no slot, so the sharer's
  // read of it is missing; a row stored again at the begin is its own.
  ShadowMap evicted;
  write_rows(evicted, 3, 4);
  const std::vector<std::int64_t> gone{0}, keep;
  evicted.release(gone, keep, [](const ShadowRow&) { return false; });
  const std::vector<std::int64_t> stored{-1, 30, -1};
  const std::vector<std::uint64_t> seqs = evicted.begin_prefix(1, 0, 3, stored);
  CHECK(seqs[0] == 0);
  CHECK(seqs[1] > 0);
  CHECK(evicted.at(30).request == 1);
  const QueryObservation e = decode_of(evicted, 1, 3, 20, {0, 30, 2, 20}, 4);
  CHECK(e.missing == std::vector<std::int64_t>{0});
  CHECK(e.overwritten.empty());
  CHECK(reads_correct(decode_of(evicted, 1, 4, 21, {30, 2, 20, 21}, 4)));
}

namespace {

/// One write of `request` at position `p` into `slot` (no read; window
/// `keys`): the step's observation.
StepObservation write_one(ShadowMap& shadow, std::int64_t request, std::int64_t p, std::int64_t slot,
                          std::int64_t keys = 1) {
  return one_row_step(shadow, request, p, slot, {}, keys);
}

}  // namespace

TEST_CASE(
    "Shadow map: a cached row is no request's, a write evicts it, a free ends it, a prefix begin reads it "
    "until then") {
  // Request 0 wrote positions 0..3 at slots 0..3 (blocks of 2) and its
  // blocks went to the free pool cached.
  const std::vector<std::int64_t> none, all{0, 1, 2, 3};
  const auto nobody = [](const ShadowRow&) { return false; };
  const auto cached_pool = [&] {
    ShadowMap m;
    write_rows(m, 4, 4);
    REQUIRE(m.release(all, none, nobody, nullptr, true).empty());
    return m;
  };
  ShadowMap m = cached_pool();
  CHECK(m.at(2).cached);
  CHECK(m.at(2).position == 2);  // still resolvable
  const ShadowMap::Resident r = m.resident_totals(2);
  CHECK(r.rows == 0);
  CHECK(r.blocks == 0);
  CHECK(r.cached_rows == 4);
  CHECK(r.cached_blocks == 2);
  CHECK(m.resident_counts(2).request_blocks == 0);  // no bound counts them
  CHECK(m.resident().empty());

  // Caching a row a query still to run may read loses it, as freeing it does.
  ShadowMap visible;
  write_rows(visible, 2, 2);
  const std::vector<std::int64_t> one{1};
  CHECK(visible
            .release(
                one, none, [](const ShadowRow&) { return true; }, nullptr, true)
            .size() == 1);

  // A prefix hit on the cached rows: request 3 (keys 3) sees positions 2
  // and 3, which it holds again; positions 0 and 1 stay cached.
  ShadowMap hit = cached_pool();
  ShadowMap::PrefixTally tally;
  hit.begin_prefix(3, 0, 4, none, 2, &tally);
  CHECK(tally.evicted_positions == 0);
  CHECK_FALSE(hit.at(2).cached);
  CHECK(hit.at(0).cached);
  CHECK(reads_correct(decode_of(hit, 3, 4, 12, {2, 3, 12}, 3)));
  CHECK(hit.resident_totals(2).rows == 3);
  CHECK(hit.resident_totals(2).cached_rows == 2);
  // With blocks of 2 the block a hit takes back leaves the pool whole: a
  // first query seeing position 3 takes slots 2 and 3 back, not 0 and 1.
  ShadowMap whole = cached_pool();
  whole.begin_prefix(3, 0, 4, none, 3, &tally, 2);
  CHECK_FALSE(whole.at(2).cached);
  CHECK_FALSE(whole.at(3).cached);
  CHECK(whole.at(1).cached);

  // Request 2 takes slots 2 and 3: two cached rows evicted, no failure.
  ShadowMap evicted = cached_pool();
  CHECK(write_one(evicted, 2, 0, 2).evicted_rows == 1);
  CHECK(write_one(evicted, 2, 1, 3).evicted_rows == 1);
  CHECK(write_one(evicted, 2, 2, 3).evicted_rows == 0);  // its own row there now
  // A begin that stores positions 2 and 3 again reads correctly; one that
  // answers them shared reads request 2's rows: missing, and extra reads.
  ShadowMap recomputed = evicted;
  const std::vector<std::int64_t> stored{-1, -1, 10, 11};
  recomputed.begin_prefix(3, 0, 4, stored, 2, &tally);
  CHECK(tally.evicted_positions == 2);
  CHECK(reads_correct(decode_of(recomputed, 3, 4, 12, {10, 11, 12}, 3)));
  ShadowMap stale = evicted;
  stale.begin_prefix(3, 0, 4, none, 2, &tally);
  CHECK(tally.evicted_positions == 2);
  const QueryObservation q = decode_of(stale, 3, 4, 12, {2, 3, 12}, 3);
  CHECK(q.missing == std::vector<std::int64_t>{2, 3});
  CHECK(q.extra.size() == 2);

  // A free of a cached slot ends it: a later begin finds the row gone.
  ShadowMap ended = cached_pool();
  const std::vector<std::int64_t> block1{2, 3};
  ended.release(block1, none, nobody);
  CHECK(ended.at(2).request < 0);
  ended.begin_prefix(3, 0, 4, none, 2, &tally);
  CHECK(tally.evicted_positions == 2);
  CHECK(decode_of(ended, 3, 4, 12, {12}, 3).missing == std::vector<std::int64_t>{2, 3});

  // Request 1 copied request 0's position 0 into slot 4 (copy-on-write) and
  // its cache let the copy go, cached; request 0 (window 3) then writes
  // position 2 into slot 4: an eviction, not a row of its own replaced (it
  // still reads the original at slot 0).
  ShadowMap own;
  write_rows(own, 2, 3);
  own.begin_prefix(1, 0, 1, none);
  CHECK(reads_correct(decode_of(own, 1, 1, 5, {4, 5}, 3, {{0, 4}})));
  const std::vector<std::int64_t> copy{4};
  CHECK(own.release(copy, none, nobody, nullptr, true).empty());
  const StepObservation over = write_one(own, 0, 2, 4, 3);
  CHECK(over.collisions.replaced_needed == 0);
  CHECK(over.evicted_rows == 1);
}

TEST_CASE(
    "Shadow map: a resume's prefix hit takes back the block its rows were stored in, not a cached "
    "copy-on-write copy of them") {
  // docs/semantics.md "Preemption" (paged_cache.py --preempt --prefix-cache,
  // blocks of 4): request 0 wrote positions 0..3 at slots 0..3; request 1
  // began from its first 2 and copied them into its own block (slots 4, 5)
  // before writing position 2 at slot 6. Request 1's window let that block
  // go, cached under its own hash; request 0 is preempted, its block cached.
  const std::vector<std::int64_t> none, copy_block{4, 5, 6}, own_block{0, 1, 2, 3};
  const auto nobody = [](const ShadowRow&) { return false; };
  ShadowMap m;
  write_rows(m, 4, 8);
  m.begin_prefix(1, 0, 2, none);
  CHECK(reads_correct(decode_of(m, 1, 2, 6, {4, 5, 6}, 8, {{0, 4}, {1, 5}})));
  REQUIRE(m.release(copy_block, none, nobody, nullptr, true).empty());
  REQUIRE(m.release(own_block, none, nobody, nullptr, true).empty());
  // The resume answers -1 for positions 0..3 (the cache took its block
  // back): block 0 is held again, request 1's cached copy stays cached (it
  // holds request 1's row at slot 6, which no request sees: were it taken
  // back, its writer would hold a block it does not).
  ShadowMap::PrefixTally tally;
  m.begin_prefix(0, 0, 4, none, 0, &tally, 4);
  CHECK(tally.held_positions == 4);
  for (const std::int64_t slot : own_block) CHECK_FALSE(m.at(slot).cached);
  for (const std::int64_t slot : copy_block) CHECK(m.at(slot).cached);
  const auto sees = [](const ShadowRow& r) { return r.request == 0; };
  const auto live = [](std::int64_t) { return true; };
  CHECK(m.resident_counts(4, sees, live).request_blocks == 1);
  CHECK(reads_correct(decode_of(m, 0, 4, 8, {0, 1, 2, 3, 8}, 8)));

  // The same when request 1, preempted after its copy (the copy freed),
  // stored positions 0..2 again at its resume (slots 4..6, request 0's
  // content at 4 and 5) and its block went to the pool cached.
  ShadowMap again;
  write_rows(again, 3, 8);
  again.begin_prefix(1, 0, 2, none);
  CHECK(reads_correct(decode_of(again, 1, 2, 6, {4, 5, 6}, 8, {{0, 4}, {1, 5}})));
  REQUIRE(again.release(copy_block, none, nobody).empty());
  const std::vector<std::int64_t> restored{4, 5, 6};
  again.begin_prefix(1, 1, 3, restored, 0, &tally, 4);
  CHECK(reads_correct(decode_of(again, 0, 3, 3, {0, 1, 2, 3}, 8)));
  // Request 0 is preempted and resumed while request 1 still holds slots
  // 4..6: its resume takes its own cached block back, not request 1's rows
  // (so a second preempt and resume, once request 1's block is cached too,
  // still takes block 0 back).
  for (int round = 0; round < 2; ++round) {
    REQUIRE(again.release(own_block, none, nobody, nullptr, true).empty());
    if (round == 1) REQUIRE(again.release(copy_block, none, nobody, nullptr, true).empty());
    again.begin_prefix(0, 0, 4, none, 0, &tally, 4);
    for (const std::int64_t slot : own_block) CHECK_FALSE(again.at(slot).cached);
    for (const std::int64_t slot : copy_block) CHECK(again.at(slot).cached == (round == 1));
  }
  CHECK(reads_correct(decode_of(again, 0, 4, 8, {0, 1, 2, 3, 8}, 8)));
}

TEST_CASE(
    "Shadow map: row lineage: a prefix row stored again is its source's row, a cached copy serves a "
    "later begin, a row written again is new") {
  // docs/semantics.md "Row lineage".
  const std::vector<std::int64_t> none;
  const auto nobody = [](const ShadowRow&) { return false; };
  const auto everyone = [](const ShadowRow&) { return true; };
  // Request 0 wrote positions 0..3 at slots 0..3 and finished (cached);
  // request 2 evicted them all.
  ShadowMap m;
  write_rows(m, 4, 8);
  const std::vector<std::int64_t> first4{0, 1, 2, 3};
  REQUIRE(m.release(first4, none, nobody, nullptr, true).empty());
  for (std::int64_t p = 0; p < 4; ++p) CHECK(write_one(m, 2, p, p).evicted_rows == 1);
  // Request 1 begins from request 0's 4 positions and stores them again at
  // slots 10..13: its slots, request 0's rows.
  const std::vector<std::int64_t> again{10, 11, 12, 13};
  CHECK(m.begin_prefix(1, 0, 4, again)[1] > 0);
  CHECK(m.at(11).request == 1);
  CHECK(m.at(11).origin_request == 0);
  CHECK(reads_correct(decode_of(m, 1, 4, 14, {10, 11, 12, 13, 14}, 8)));
  // Request 1 finishes; a cache hashing by content keeps its copies under
  // request 0's block hashes.
  const std::vector<std::int64_t> of_1{10, 11, 12, 13, 14};
  REQUIRE(m.release(of_1, none, nobody, nullptr, true).empty());
  // Request 3 begins from request 0's 4 positions, sharing (-1): the copies
  // hold request 0's rows, so reading them is correct (before lineage:
  // missing [0, 1, 2, 3] and four extra reads), and the begin found them.
  ShadowMap::PrefixTally tally;
  m.begin_prefix(3, 0, 4, none, 0, &tally);
  CHECK(tally.evicted_positions == 0);
  CHECK_FALSE(m.at(10).cached);  // held again by request 3
  CHECK(m.at(14).cached);        // request 1's own row stays cached
  const QueryObservation hit = decode_of(m, 3, 4, 20, {10, 11, 12, 13, 20}, 8);
  CHECK(reads_correct(hit));
  REQUIRE(hit.reads.size() == 5);
  CHECK(hit.reads[1].request == 1);
  CHECK(hit.reads[1].lineage() == 0);
  CHECK(hit.reads[4].origin_request == -1);  // a row of its own
  // Through a chain: request 4 from request 3's prefix holds the same rows.
  m.begin_prefix(4, 3, 4, none);
  CHECK(reads_correct(decode_of(m, 4, 4, 21, {10, 11, 12, 13, 21}, 8)));
  // A slot that holds another lineage's row is still wrong: request 1's own
  // row at position 4 read for request 5's position 4 from request 3 is not
  // request 3's.
  m.begin_prefix(5, 3, 5, none);
  const QueryObservation wrong = decode_of(m, 5, 5, 22, {10, 11, 12, 13, 14, 22}, 8);
  CHECK(wrong.missing == std::vector<std::int64_t>{4});
  CHECK(wrong.extra.size() == 1);

  // The same request and position written again (after a trim or reset) is
  // new content: a copy of the old row is stale.
  ShadowMap t;
  write_rows(t, 2, 4);
  const std::vector<std::int64_t> stored{10, 11};
  t.begin_prefix(1, 0, 2, stored);
  write_one(t, 0, 1, 5, 4);  // request 0 writes position 1 again, at slot 5
  t.begin_prefix(2, 0, 2, none);
  const QueryObservation stale = decode_of(t, 2, 2, 30, {10, 11, 30}, 4);
  CHECK(stale.overwritten == std::vector<std::int64_t>{1});  // slot 11 holds request 0's old row 1
  CHECK(stale.missing.empty());
  CHECK(reads_correct(decode_of(t, 2, 3, 31, {10, 5, 30, 31}, 4)));
  write_one(t, 1, 1, 12, 4);  // request 1 writes its position 1 again
  CHECK(decode_of(t, 1, 2, 32, {10, 11, 32}, 4).overwritten == std::vector<std::int64_t>{1});
  CHECK(reads_correct(decode_of(t, 1, 3, 33, {10, 12, 32, 33}, 4)));

  // A free of a copy loses nothing while another slot holds its lineage
  // (not a cached one: any write may take that).
  ShadowMap f;
  write_rows(f, 2, 4);
  f.begin_prefix(1, 0, 2, stored);
  const std::vector<std::int64_t> slot10{10}, slot1{1}, slot11{11};
  CHECK(f.release(slot10, none, everyone).empty());  // slot 0 holds it
  REQUIRE(f.release(slot1, none, nobody, nullptr, true).empty());
  CHECK(f.release(slot11, none, everyone).size() == 1);  // only cached slot 1 holds it
}

TEST_CASE("Side by side: by lineage, a cache that shares prefix rows and one that stores them again agree") {
  // Request 0 wrote positions 0..3; request 1 begins from them: one cache
  // shares slots 0..3, the other stores them again at 10..13.
  const std::vector<std::int64_t> none, again{10, 11, 12, 13};
  ShadowMap shares, stores;
  write_rows(shares, 4, 8);
  write_rows(stores, 4, 8);
  shares.begin_prefix(1, 0, 4, none);
  stores.begin_prefix(1, 0, 4, again);
  RunObservation a, b;
  a.observed = b.observed = "slots+outputs";
  a.steps.resize(1);
  b.steps.resize(1);
  a.steps[0].queries.push_back(decode_of(shares, 1, 4, 4, {0, 1, 2, 3, 4}, 8));
  b.steps[0].queries.push_back(decode_of(stores, 1, 4, 14, {10, 11, 12, 13, 14}, 8));
  a.steps[0].resident = shares.resident();
  b.steps[0].resident = stores.resident();
  CHECK(a.steps[0].resident == b.steps[0].resident);  // r0 p0..3, r1 p4: each lineage once
  CHECK(a.steps[0].resident.size() == 5);
  const PairComparison same = compare_runs(a, b, false);
  CHECK_FALSE(same.differ());
  CHECK(same.counts.reads == 1);
  CHECK(same.counts.resident == 1);
  // Once request 0's own rows are freed in the second cache it still holds
  // them by lineage (request 1's copies); one that lost a copy does not.
  const std::vector<std::int64_t> originals{0, 1, 2, 3}, copy13{13};
  stores.release(originals, none, [](const ShadowRow&) { return false; });
  CHECK(stores.resident() == shares.resident());
  stores.release(copy13, none, [](const ShadowRow&) { return false; });
  b.steps[0].resident = stores.resident();
  const PairComparison lost = compare_runs(a, b, false);
  REQUIRE(lost.differences.size() == 1);
  CHECK(lost.differences[0].detail == "by lineage, A holds r0 p3 that B does not");
}

TEST_CASE("Resident bound: a cache holding more than it declares fails: a freed visible row fails") {
  std::int64_t over = 0, freed_visible = 0, ran = 0;
  WrappedCpuProvider ring_bound = bounded_provider(0, false), tiny_bound = bounded_provider(2, false),
                     frees_visible = bounded_provider(0, true);
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const auto sc = generate_scenario(case_seed(11, static_cast<std::int64_t>(seed)));
    RunOptions o;
    o.provider = &ring_bound;
    const RunObservation fits = run_scenario(sc, o);
    if (fits.skipped) continue;
    ++ran;
    INFO("seed " << seed << ": " << fits.first_failure);
    CHECK(fits.passed);  // a ring never holds more than states * capacity rows
    CHECK(fits.steps_over_bound == 0);
    REQUIRE_FALSE(fits.steps.empty());
    CHECK(fits.steps.back().resident_rows > 0);
    CHECK(fits.steps.back().bound_limit == sc.cache.states * sc.cache.ring_rows);

    o.provider = &tiny_bound;
    const RunObservation tight = run_scenario(sc, o);
    const bool holds_more = std::any_of(fits.steps.begin(), fits.steps.end(),
                                        [](const StepObservation& s) { return s.bound_held > 2; });
    CHECK(tight.passed == !holds_more);
    if (holds_more) {
      ++over;
      CHECK(tight.steps_over_bound > 0);
      CHECK_THAT(tight.first_failure, Catch::Contains("over its declared resident bound of 2"));
    }

    o.provider = &frees_visible;
    const RunObservation freeing = run_scenario(sc, o);
    if (freeing.freed_visible > 0) {
      ++freed_visible;
      CHECK_FALSE(freeing.passed);
      CHECK_THAT(freeing.first_failure, Catch::Contains("rows still visible"));
    }
  }
  CHECK(ran > 10);
  CHECK(over > 5);
  CHECK(freed_visible > 0);
}

namespace {

/// The CPU ring pool (a capacity no schedule below wraps) answering frees as
/// an engine with a free deferral does: a row that left the window (below
/// its request's next query's window by more than its last committed row)
/// is freed `delay` write steps of its request later.
class DeferringCache final : public engines::CacheUnderTest {
 public:
  DeferringCache(std::unique_ptr<engines::CacheUnderTest> inner, std::int64_t keys, std::int64_t delay)
      : inner_(std::move(inner)), keys_(keys), delay_(delay) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    const auto st = inner_->call(c, answer);
    if (st || answer == nullptr || c.op != engines::StepCall::Op::kStep || c.rows == 0) return st;
    const std::int64_t count = ++writes_;
    for (std::int64_t i = 0; i < c.rows; ++i)
      held_.push_back(Row{answer->written[static_cast<std::size_t>(i)], c.position + i, -1});
    const std::int64_t first = c.position + c.rows;  // decodes and prefills commit every row
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->left_at < 0 && it->position < first - std::max<std::int64_t>(keys_, 2) + 1) it->left_at = count;
      if (it->left_at >= 0 && it->left_at + delay_ <= count) {
        answer->freed.push_back(it->slot);
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
    return st;
  }

 private:
  struct Row {
    std::int64_t slot, position, left_at;  // left_at: the write step count it left at (-1: not yet)
  };
  std::unique_ptr<engines::CacheUnderTest> inner_;
  std::int64_t keys_, delay_, writes_ = 0;
  std::vector<Row> held_;
};

/// Frees `delay` write steps late, declaring `declared` (none: no deferral).
WrappedCpuProvider deferring_provider(std::int64_t delay, std::optional<std::int64_t> declared) {
  return WrappedCpuProvider(
      "deferring",
      [declared](engines::Capabilities& caps) {
        caps.reports_frees = true;
        caps.free_deferral_steps = declared;
      },
      [delay](std::unique_ptr<engines::CacheUnderTest> inner, const engines::CacheSpec& spec) {
        return std::make_unique<DeferringCache>(std::move(inner), spec.window_keys, delay);
      });
}

/// One request of W = `keys` keys on a ring of 32 rows: a prefill of 6
/// rows, then 10 decodes.
scenarios::Scenario deferral_scenario(std::int64_t keys) {
  std::string steps = R"({"kind": "prefill", "request": 0, "rows": 6, "order": "store_then_load"})";
  for (int i = 0; i < 10; ++i) steps += R"(, {"kind": "decode", "request": 0})";
  return scenarios::parse_scenario(R"({"schema_version": 1, "name": "deferral", "description": "one request",
    "cache": {"window": )" + std::to_string(keys) +
                                       R"(, "window_convention": "keys", "ring_rows": 32, "states": 1,
      "q_heads": 1, "kv_heads": 1, "head_dim": 4, "shared_row": false, "format": "f64",
      "rope": {"style": "none", "rotary_dims": 0, "base": 10000.0}, "layers": 1, "softmax_scale": null,
      "sink_logit": null},
    "data": {"seed": 3, "rows": []}, "requests": [{"id": 0, "state": 0}], "steps": [)" +
                                       steps + "]}",
                                   "deferral");
}

}  // namespace

TEST_CASE("Free deferral: a row freed D write steps after it left passes a declared N exactly when D <= N") {
  for (const std::int64_t keys : {1, 2, 4}) {
    const scenarios::Scenario sc = deferral_scenario(keys);
    for (std::int64_t delay = 0; delay <= 3; ++delay) {
      for (std::int64_t declared = 0; declared <= 3; ++declared) {
        INFO("keys " << keys << ", freed " << delay << " steps late, declared " << declared);
        WrappedCpuProvider provider = deferring_provider(delay, declared);
        RunOptions o;
        o.provider = &provider;
        const RunObservation run = run_scenario(sc, o);
        REQUIRE_FALSE(run.skipped);
        INFO(run.first_failure);
        CHECK(run.passed == (delay <= declared));
        if (delay <= declared) {
          CHECK(run.late_frees == 0);
          continue;
        }
        CHECK(run.late_frees > 0);
        // The first late block is named with how late it is and when it left.
        CHECK_THAT(run.first_failure, Catch::Contains("blocks freed later than declared; first: slot "));
        CHECK_THAT(run.first_failure,
                   Catch::Contains("still held " + std::to_string(declared) +
                                   " write steps of request 0 after it left the window at step "));
        CHECK_THAT(run.first_failure,
                   Catch::Contains("the declared free deferral is " + std::to_string(declared)));
      }
    }
    // Nothing declared: no deadline, however late (only the bound, if any, counts).
    WrappedCpuProvider undeclared = deferring_provider(3, std::nullopt);
    RunOptions o;
    o.provider = &undeclared;
    CHECK(run_scenario(sc, o).passed);
    // Never freed: late at the declared step, and at every one after.
    WrappedCpuProvider never = deferring_provider(100, 2);
    o.provider = &never;
    const RunObservation kept = run_scenario(sc, o);
    CHECK_FALSE(kept.passed);
    CHECK(kept.late_frees > 1);
  }
}

namespace {

/// A rolling cache that computes no outputs (a block manager without a
/// kernel): W slots, the oldest row at slot 0. Once full, each decode first
/// shifts every row one slot down (moved 1 -> 0, 2 -> 1, ...) and writes the
/// new row at slot W - 1; `wrong_order` shifts from the top down, which
/// copies one row twice and drops another.
class RollingCache final : public engines::CacheUnderTest {
 public:
  RollingCache(std::int64_t slots, bool wrong_order) : w_(slots), wrong_order_(wrong_order) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    if (answer) answer->clear();
    if (c.op == engines::StepCall::Op::kBegin || c.step.kind != scenarios::StepKind::kDecode) return std::nullopt;
    if (answer == nullptr) return std::nullopt;
    const std::int64_t p = c.position;
    std::int64_t slot = p;
    if (p >= w_) {
      slot = w_ - 1;
      for (std::int64_t s = 1; s < w_; ++s) {
        const std::int64_t from = wrong_order_ ? w_ - s : s;
        answer->moved.emplace_back(from, from - 1);
      }
    }
    answer->out.assign(static_cast<std::size_t>(c.rows * 4), 0.0);
    answer->has_written = answer->has_reads = true;
    answer->written = {slot};
    answer->read_offsets = {0};
    for (std::int64_t s = 0; s <= slot; ++s) answer->read_slots.push_back(s);
    answer->read_offsets.push_back(static_cast<std::int64_t>(answer->read_slots.size()));
    return std::nullopt;
  }

 private:
  std::int64_t w_;
  bool wrong_order_;
};

class RollingProvider final : public engines::CacheProvider {
 public:
  RollingProvider(std::int64_t slots, bool wrong_order) : slots_(slots), wrong_order_(wrong_order) {
    caps_.name = "rolling";
    caps_.computes_outputs = false;
    caps_.accumulation = engines::Accumulation::kF64;
  }
  const engines::Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return "rolling"; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec&, engines::Refusal*) override {
    return std::make_unique<RollingCache>(slots_, wrong_order_);
  }

 private:
  std::int64_t slots_;
  bool wrong_order_;
  engines::Capabilities caps_;
};

}  // namespace

TEST_CASE("Moves: a rolling bookkeeping-only cache passes: shifting in the wrong order loses a row") {
  // Window 4 keys; the cache keeps exactly 4 rows and rolls them. kvcheck
  // computes the outputs over the rows its shadow map holds, moved rows too.
  scenarios::Scenario sc;
  sc.name = "rolling";
  sc.cache.window = sc.cache.ring_rows = 4;
  sc.cache.head_dim = 4;
  sc.requests = {{0, 0}};
  for (int i = 0; i < 10; ++i) {
    scenarios::Step d;
    d.kind = scenarios::StepKind::kDecode;
    sc.steps.push_back(d);
  }
  RollingProvider rolling(4, false), wrong(4, true);
  RunOptions o;
  o.provider = &rolling;
  const RunObservation ok = run_scenario(sc, o);
  INFO(ok.first_failure);
  CHECK(ok.passed);
  CHECK(ok.queries == 10);
  CHECK(ok.queries_not_output_checked == 0);
  o.provider = &wrong;
  const RunObservation lost = run_scenario(sc, o);
  CHECK_FALSE(lost.passed);
  REQUIRE(lost.first_failing_step == 4);  // the first shift
  CHECK(lost.lost_rows > 0);
  CHECK_THAT(lost.first_failure, Catch::Contains("step 4 (decode) layer 0 query 4: overwritten ["));
}

namespace {

/// The CPU ring pool, its outputs rounded into `round` (none: as it
/// computes them) and its capabilities declaring `declared` as the output
/// format: a kernel that accumulates in f32 and writes bf16, or one that
/// says so without doing it, or does it without saying so.
class OutputFormatCache final : public engines::CacheUnderTest {
 public:
  OutputFormatCache(std::unique_ptr<engines::CacheUnderTest> inner, OutputFormat round)
      : inner_(std::move(inner)), round_(round) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    engines::StepStatus status = inner_->call(c, answer);
    if (!status)
      for (double& x : answer->out) x = model::round_output(round_, x);
    return status;
  }
  engines::StepStatus probe(const std::string& name, const engines::StepCall& context) override {
    return inner_->probe(name, context);
  }

 private:
  std::unique_ptr<engines::CacheUnderTest> inner_;
  OutputFormat round_;
};

/// Outputs rounded into `round`, declaring `declared`.
WrappedCpuProvider output_format_provider(OutputFormat round, OutputFormat declared) {
  return WrappedCpuProvider(
      "cpu-output-format", [declared](engines::Capabilities& caps) { caps.output_format = declared; },
      [round](std::unique_ptr<engines::CacheUnderTest> inner, const engines::CacheSpec&) {
        return std::make_unique<OutputFormatCache>(std::move(inner), round);
      });
}

}  // namespace

TEST_CASE("Output formats: bf16 outputs pass declared, fail undeclared, and a declared format must hold them") {
  scenarios::Scenario sc;
  sc.name = "bf16-outputs";
  sc.cache.window = sc.cache.ring_rows = 4;
  sc.cache.head_dim = 8;
  sc.cache.format = scenarios::Format::kF32;
  sc.requests = {{0, 0}};
  scenarios::Step prefill;
  prefill.kind = scenarios::StepKind::kPrefill;
  prefill.rows = 3;
  sc.steps.push_back(prefill);
  for (int i = 0; i < 6; ++i) {
    scenarios::Step d;
    d.kind = scenarios::StepKind::kDecode;
    sc.steps.push_back(d);
  }
  const auto run = [&](OutputFormat round, OutputFormat declared) {
    WrappedCpuProvider provider = output_format_provider(round, declared);
    RunOptions o;
    o.provider = &provider;
    return run_scenario(sc, o);
  };
  // Rounded once into bf16 after the f32 accumulation, and declared: passes,
  // with the rounding term in every query's tolerance.
  const RunObservation ok = run(OutputFormat::kBf16, OutputFormat::kBf16);
  INFO(ok.first_failure);
  CHECK(ok.passed);
  CHECK(ok.queries == 9);
  CHECK(ok.queries_not_output_checked == 0);
  CHECK(ok.output_format == "bf16");
  CHECK(ok.max_output_rounding_tolerance >= 0x1.0p-10);
  // Rounded without the declaration: held to the f32 accumulation alone, it fails.
  const RunObservation undeclared = run(OutputFormat::kBf16, OutputFormat::kAccumulation);
  CHECK_FALSE(undeclared.passed);
  CHECK_THAT(undeclared.first_failure, Catch::Contains("output differs by"));
  CHECK(undeclared.output_format.empty());
  // Declared but not done: f32 outputs are not bf16 values.
  const RunObservation claimed = run(OutputFormat::kAccumulation, OutputFormat::kBf16);
  CHECK_FALSE(claimed.passed);
  CHECK_THAT(claimed.first_failure, Catch::Contains("output elements are not bf16 values, the output format the cache declares"));
  // f32 outputs of the f32 accumulation: declared, nothing added, and they pass.
  const RunObservation f32 = run(OutputFormat::kAccumulation, OutputFormat::kF32);
  CHECK(f32.passed);
  CHECK(f32.max_output_rounding_tolerance == 0);
}

namespace {

/// The CPU ring pool (each layer its own ring of states * capacity slots)
/// answering slots as a cache whose layers share one pool: with `offset`
/// layer l's slots are moved past the layers before it (one id space, no id
/// named twice), without it every layer answers the same ids (one pool
/// handing each slot to every layer).
class SharedPoolCache final : public engines::CacheUnderTest {
 public:
  SharedPoolCache(std::unique_ptr<engines::CacheUnderTest> inner, std::int64_t layer_slots, bool offset)
      : inner_(std::move(inner)), layer_slots_(layer_slots), offset_(offset) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    const auto st = inner_->call(c, answer);
    if (st || answer == nullptr || !offset_) return st;
    const std::int64_t base = c.layer * layer_slots_;
    for (auto& slot : answer->written) slot += slot >= 0 ? base : 0;
    for (auto& slot : answer->read_slots) slot += slot >= 0 ? base : 0;
    return st;
  }

 private:
  std::unique_ptr<engines::CacheUnderTest> inner_;
  std::int64_t layer_slots_;
  bool offset_;
};

/// `rows_limit`: a resident bound of rows in all (0: the default limit; -1: none).
WrappedCpuProvider shared_pool_provider(bool shared, bool offset, std::int64_t rows_limit = -1) {
  return WrappedCpuProvider(
      "shared-pool",
      [shared, rows_limit](engines::Capabilities& caps) {
        caps.shared_pool = shared;
        caps.ring_addressing = false;  // opaque slots: one id space across the layers
        caps.slots_in_pool = false;
        if (rows_limit >= 0) {
          caps.resident_bound.unit = engines::ResidentBound::Unit::kRows;
          caps.resident_bound.limit = rows_limit;
        }
      },
      [offset](std::unique_ptr<engines::CacheUnderTest> inner, const engines::CacheSpec& spec) {
        return std::make_unique<SharedPoolCache>(std::move(inner), spec.cache.states * spec.cache.ring_rows,
                                                 offset);
      });
}

/// One request on two layers (a ring of 8): with `window` keys (default 4),
/// a prefill of 3 rows (`prefill`), then `decodes` decodes.
scenarios::Scenario two_layer_scenario(int window = 4, bool prefill = true, int decodes = 6) {
  std::string steps =
      prefill ? R"({"kind": "prefill", "request": 0, "rows": 3, "order": "store_then_load"})" : "";
  for (int i = 0; i < decodes; ++i)
    steps += std::string(steps.empty() ? "" : ", ") + R"({"kind": "decode", "request": 0})";
  return scenarios::parse_scenario(
      R"({"schema_version": 1, "name": "two-layers", "description": "one request",
    "cache": {"window": )" +
          std::to_string(window) + R"(, "window_convention": "keys", "ring_rows": 8, "states": 1,
      "q_heads": 1, "kv_heads": 1, "head_dim": 4, "shared_row": false, "format": "f64",
      "rope": {"style": "none", "rotary_dims": 0, "base": 10000.0}, "layers": 2, "softmax_scale": null,
      "sink_logit": null},
    "data": {"seed": 3, "rows": []}, "requests": [{"id": 0, "state": 0}], "steps": [)" +
          steps + "]}",
      "two-layers");
}

}  // namespace

TEST_CASE("One pool across layers: a slot handed to two layers is an other-layer collision, ids apart pass") {
  const scenarios::Scenario sc = two_layer_scenario();
  RunOptions o;
  // Each layer's ids apart in the one pool: nothing collides.
  WrappedCpuProvider apart = shared_pool_provider(true, true);
  o.provider = &apart;
  const RunObservation ok = run_scenario(sc, o);
  INFO(ok.first_failure);
  CHECK(ok.passed);
  CHECK(ok.collisions == 0);
  // The same ids on both layers, declared as one pool: layer 1's prefill
  // writes the slots of layer 0's three rows, which layer 0 still sees.
  WrappedCpuProvider same = shared_pool_provider(true, false);
  o.provider = &same;
  const RunObservation bad = run_scenario(sc, o);
  CHECK_FALSE(bad.passed);
  REQUIRE(bad.steps.size() >= 2);
  CHECK(bad.steps[0].collisions.other_layer == 0);  // layer 0 wrote first
  CHECK(bad.steps[1].layer == 1);
  CHECK(bad.steps[1].collisions.other_layer == 3);
  CHECK(bad.first_failing_step == 1);
  CHECK_THAT(
      bad.first_failure,
      Catch::Contains("0 replaced-needed, 3 other-layer collisions (expected 0 in all); first other-layer: "
                      "layer 1 wrote slot 0 holding request 0 position 0 on layer 0, which layer 0 still "
                      "sees"));
  // Layer 0 then reads its rows where layer 1's now lie: overwritten.
  CHECK(bad.lost_rows > 0);
  // The same ids without a shared pool: each layer's slots are its own.
  WrappedCpuProvider own = shared_pool_provider(false, false);
  o.provider = &own;
  CHECK(run_scenario(sc, o).passed);
}

namespace {

/// Two layers of one pool (one request, state 0, a ring of `ring` rows):
/// layer 0 stores position p at slot p mod ring and frees its previous row's
/// slot with each write (one key: no query sees it again); layer 1's slots
/// are one behind, so it writes the slot layer 0 freed in the same step.
class HandOverCache final : public engines::CacheUnderTest {
 public:
  HandOverCache(std::unique_ptr<engines::CacheUnderTest> inner, std::int64_t ring)
      : inner_(std::move(inner)), ring_(ring) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    const auto st = inner_->call(c, answer);
    if (st || answer == nullptr || !answer->has_written || c.op != engines::StepCall::Op::kStep) return st;
    if (c.layer == 0) {
      if (last_ >= 0) answer->freed.push_back(last_);
      last_ = answer->written.back();
      return st;
    }
    for (auto& slot : answer->written) slot = (slot + ring_ - 1) % ring_;
    for (auto& slot : answer->read_slots) slot = (slot + ring_ - 1) % ring_;
    return st;
  }

 private:
  std::unique_ptr<engines::CacheUnderTest> inner_;
  std::int64_t ring_;
  std::int64_t last_ = -1;
};

WrappedCpuProvider hand_over_provider(bool shared) {
  return WrappedCpuProvider(
      "hand-over",
      [shared](engines::Capabilities& caps) {
        caps.shared_pool = shared;
        caps.reports_frees = true;
        caps.ring_addressing = false;
        caps.slots_in_pool = false;
      },
      [](std::unique_ptr<engines::CacheUnderTest> inner, const engines::CacheSpec& spec) {
        return std::make_unique<HandOverCache>(std::move(inner), spec.cache.ring_rows);
      });
}

}  // namespace

TEST_CASE(
    "One pool across layers: a slot one layer freed and another then wrote is counted (slot_across_layers)") {
  // One key, six decodes: each layer lets go of its last row's slot at every step.
  const scenarios::Scenario sc = two_layer_scenario(1, false, 6);
  RunOptions o;
  WrappedCpuProvider shared = hand_over_provider(true);
  o.provider = &shared;
  const RunObservation run = run_scenario(sc, o);
  INFO(run.first_failure);
  CHECK(run.passed);
  CHECK(run.collisions == 0);
  // Decodes 1..5: layer 1 writes the slot layer 0 freed in the same step.
  CHECK(run.slots_across_layers == 5);
  Coverage cov;
  classify_cached(run, &cov);
  CHECK(cov.slot_across_layers);
  // Declared as a pool per layer: the slots are each layer's own, nothing handed over.
  WrappedCpuProvider apart = hand_over_provider(false);
  o.provider = &apart;
  const RunObservation own = run_scenario(sc, o);
  CHECK(own.passed);
  CHECK(own.slots_across_layers == 0);
  // Reachable only for a cache that declares the shared pool and reports its frees.
  engines::Capabilities caps = shared.capabilities();
  const std::size_t k = 28;
  REQUIRE(coverage_names()[k] == "slot_across_layers");
  CHECK(reachable_coverage(caps)[k]);
  caps.reports_frees = false;
  CHECK_FALSE(reachable_coverage(caps)[k]);
  caps = shared.capabilities();
  caps.shared_pool = false;
  CHECK_FALSE(reachable_coverage(caps)[k]);
}

TEST_CASE("One pool across layers: a resident bound counts every layer's rows together") {
  const scenarios::Scenario sc = two_layer_scenario();
  RunOptions o;
  // The default bound of a shared pool: layers * states * capacity = 16 rows.
  WrappedCpuProvider fits = shared_pool_provider(true, true, 0);
  o.provider = &fits;
  CHECK(run_scenario(sc, o).passed);
  // A declared 8 rows: each layer alone holds at most 8 (its ring), the two
  // together 9 once layer 0 has run the second decode (5 + 4).
  WrappedCpuProvider tight = shared_pool_provider(true, true, 8);
  o.provider = &tight;
  const RunObservation over = run_scenario(sc, o);
  CHECK_FALSE(over.passed);
  CHECK_THAT(over.first_failure,
             Catch::Contains("step 2 (decode) layer 0: holds 9 rows in all across layers, over its declared "
                             "resident bound of 8"));
  // Not shared: the same 8 rows per layer is never exceeded.
  WrappedCpuProvider per_layer = shared_pool_provider(false, true, 8);
  o.provider = &per_layer;
  CHECK(run_scenario(sc, o).passed);
}
