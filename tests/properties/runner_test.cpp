// The runner against the bundled docs/semantics.md "Golden values" scenarios and hand-built schedules.
#include <catch2/catch.hpp>

#include <filesystem>

#include "impl/kv_cache.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario_json.hpp"
#include "tests/properties/bundled_files.hpp"

using namespace kvcheck;
using namespace kvcheck::properties;
using kvcheck::test::bundled;

namespace {

std::vector<std::int64_t> counts(const StepObservation& step) {
  std::vector<std::int64_t> out;
  for (const auto& q : step.queries) out.push_back(static_cast<std::int64_t>(q.overwritten.size()));
  return out;
}

const StepObservation& last_query_step(const RunObservation& run) {
  REQUIRE(!run.steps.empty());
  return run.steps.back();
}

/// One request: `prefix` rows prefilled load_then_store in chunks of at most
/// `window` rows (so no chunk outgrows the ring), then `hazard`.
scenarios::Scenario two_steps(std::int64_t window, std::int64_t ring, std::int64_t prefix,
                              scenarios::Step hazard) {
  scenarios::Scenario sc;
  sc.name = "hand-built";
  sc.cache.window = window;
  sc.cache.ring_rows = ring;
  sc.cache.head_dim = 4;
  sc.requests = {{0, 0}};
  for (std::int64_t done = 0; done < prefix; done += window) {
    scenarios::Step prefill;
    prefill.kind = scenarios::StepKind::kPrefill;
    prefill.rows = std::min(window, prefix - done);
    sc.steps.push_back(prefill);
  }
  sc.steps.push_back(hazard);
  return sc;
}

}  // namespace

TEST_CASE("Runner: every bundled scenario replays and passes on the CPU backend") {
  const auto files = scenarios::collect_scenario_files({std::string(KVCHECK_SOURCE_DIR) + "/scenarios/fast"});
  REQUIRE(files.size() >= 12);
  for (const auto& f : files) {
    INFO(f.string());
    const RunObservation run = run_scenario(scenarios::load_scenario_file(f), RunOptions{});
    CHECK(run.passed);
    CHECK(run.first_failure.empty());
  }
}

TEST_CASE("Runner: verify at S=128 observes [5,4,3,2,1,0], at 133 and 134 zeros") {
  const auto s128 = run_scenario(bundled("verify-s128"), RunOptions{});
  CHECK(counts(last_query_step(s128)) == std::vector<std::int64_t>{5, 4, 3, 2, 1, 0});
  CHECK(last_query_step(s128).collisions.replaced_needed == 5);
  for (const char* name : {"verify-s133", "verify-s134"}) {
    const auto run = run_scenario(bundled(name), RunOptions{});
    CHECK(counts(last_query_step(run)) == std::vector<std::int64_t>{0, 0, 0, 0, 0, 0});
    CHECK(run.collisions == 0);
  }
}

TEST_CASE("Runner: the prefill example loses position 2, then 2 and 3, only when stored first") {
  const auto a = run_scenario(bundled("prefill-w3-s5-store-then-load-4-7"), RunOptions{});
  CHECK(last_query_step(a).queries[0].overwritten == std::vector<std::int64_t>{2});
  const auto b = run_scenario(bundled("prefill-w3-s5-store-then-load-4-8"), RunOptions{});
  CHECK(last_query_step(b).queries[0].overwritten == std::vector<std::int64_t>{2, 3});
  CHECK(last_query_step(b).queries[1].overwritten == std::vector<std::int64_t>{3});
  const auto c = run_scenario(bundled("prefill-w3-s5-load-then-store-4-8"), RunOptions{});
  CHECK(c.lost_rows == 0);
  CHECK(c.collisions == 0);
}

TEST_CASE("Runner: a scenario without expectations fails when a ring loses a visible row") {
  scenarios::Step verify;
  verify.kind = scenarios::StepKind::kVerify;
  verify.drafts = 3;
  auto sc = two_steps(6, 6, 20, verify);
  scenarios::Step accept;
  accept.kind = scenarios::StepKind::kAccept;
  accept.accepted = 1;
  sc.steps.push_back(accept);
  const auto lossy = run_scenario(sc, RunOptions{});
  CHECK_FALSE(lossy.passed);
  // The verify's observation; the accept after it is observed too, with no queries.
  REQUIRE(lossy.steps.size() == sc.steps.size());
  CHECK(lossy.steps.back().kind == "accept");
  CHECK(lossy.steps.back().queries.empty());
  CHECK(counts(lossy.steps[lossy.steps.size() - 2]) == std::vector<std::int64_t>{3, 2, 1, 0});
  sc.cache.ring_rows = 9;  // W + k
  const auto safe = run_scenario(sc, RunOptions{});
  CHECK(safe.passed);
  CHECK(safe.max_abs_diff < 1e-12);
}

TEST_CASE("Runner: outputs of every format are judged against the dequantized reference") {
  scenarios::Step decode;
  decode.kind = scenarios::StepKind::kDecode;
  for (const auto format : {scenarios::Format::kF64, scenarios::Format::kF32, scenarios::Format::kBf16,
                            scenarios::Format::kFp8}) {
    auto sc = two_steps(5, 7, 9, decode);
    sc.cache.format = format;
    sc.cache.q_heads = 4;
    sc.cache.kv_heads = 2;
    sc.cache.head_dim = 32;
    sc.cache.rope = {scenarios::RopeStyle::kNeox, 16, 10000.0};
    const auto run = run_scenario(sc, RunOptions{});
    INFO("format " << static_cast<int>(format) << ": " << run.first_failure);
    CHECK(run.passed);
    if (format == scenarios::Format::kFp8 || format == scenarios::Format::kBf16) {
      // Quantization error is reported separately and dominates the kernel error.
      CHECK(run.max_quant_abs_diff > run.max_abs_diff);
    }
  }
}

TEST_CASE("Runner: the RoPE fault shows up as an output difference after a wrap, not in tags") {
  scenarios::Step decode;
  decode.kind = scenarios::StepKind::kDecode;
  auto sc = two_steps(3, 4, 6, decode);
  sc.cache.rope = {scenarios::RopeStyle::kInterleaved, 4, 100.0};
  RunOptions options;
  options.fault = impl::fault_name(impl::Fault::kRopeResidentLength);
  const auto run = run_scenario(sc, options);
  CHECK_FALSE(run.passed);
  CHECK(run.lost_rows == 0);
  CHECK(run.output_failures > 0);
}

TEST_CASE("Runner: ring contents after each step are recorded for the pictures") {
  const auto run = run_scenario(bundled("verify-s128"), RunOptions{});
  const auto& ring = last_query_step(run).ring_positions;
  REQUIRE(ring.size() == 128);
  CHECK(ring[200 % 128] == 200);
  CHECK(ring[205 % 128] == 205);
}

TEST_CASE(
    "Runner: the fast attention path (head_dim 128, GQA group 4) matches the reference in every format") {
  scenarios::Step verify;
  verify.kind = scenarios::StepKind::kVerify;
  verify.drafts = 3;
  for (const auto format : {scenarios::Format::kF64, scenarios::Format::kF32, scenarios::Format::kBf16,
                            scenarios::Format::kFp8}) {
    for (const bool sink : {false, true}) {
      auto sc = two_steps(40, 43, 90, verify);
      scenarios::Step accept;
      accept.kind = scenarios::StepKind::kAccept;
      accept.accepted = 2;
      sc.steps.push_back(accept);
      sc.steps.push_back(verify);
      sc.steps.push_back(accept);
      sc.cache.format = format;
      sc.cache.q_heads = 8;
      sc.cache.kv_heads = 2;
      sc.cache.head_dim = 128;
      sc.cache.rope = {scenarios::RopeStyle::kNeox, 64, 10000.0};
      if (sink) sc.cache.sink_logit = 0.5;
      const auto run = run_scenario(sc, RunOptions{});
      INFO("format " << static_cast<int>(format) << " sink " << sink << ": " << run.first_failure);
      CHECK(run.passed);
      CHECK(run.lost_rows == 0);
      CHECK(run.queries > 90);
    }
  }
  // Odd widths and a group of 3 take the padded-chunk path.
  auto sc = two_steps(9, 12, 20, verify);
  scenarios::Step accept;
  accept.kind = scenarios::StepKind::kAccept;
  sc.steps.push_back(accept);
  sc.cache.format = scenarios::Format::kFp8;
  sc.cache.q_heads = 3;
  sc.cache.kv_heads = 1;
  sc.cache.head_dim = 48;
  const auto odd = run_scenario(sc, RunOptions{});
  INFO(odd.first_failure);
  CHECK(odd.passed);
}
