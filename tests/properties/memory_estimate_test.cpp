// Memory estimates: what drives them, how they grow, and the limit flag.
#include <catch2/catch.hpp>

#include "properties/memory_estimate.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

using namespace kvcheck;
using namespace kvcheck::properties;

namespace {

scenarios::Scenario small() {
  scenarios::Scenario sc;
  sc.name = "memory";
  sc.cache.window = 4;
  sc.cache.ring_rows = 8;
  sc.requests = {{0, 0}};
  scenarios::Step prefill;
  prefill.kind = scenarios::StepKind::kPrefill;
  prefill.rows = 6;
  sc.steps = {prefill, scenarios::Step{}};
  scenarios::validate_scenario(sc);
  return sc;
}

}  // namespace

TEST_CASE("MemoryEstimate: the pool grows with the ring by its slot and tag bytes, and the ring drives it") {
  scenarios::Scenario sc = small();
  const double base = estimate_run(sc, RunOptions{}).bytes;
  sc.cache.ring_rows = std::int64_t{1} << 28;
  const MemoryEstimate big = estimate_run(sc, RunOptions{});
  // f64 rows of 4 elements: 32 bytes each for key and value, 32 of tag and stamp per slot.
  CHECK(big.bytes - base == Approx(double((std::int64_t{1} << 28) - 8) * 96).epsilon(1e-9));
  CHECK(big.driver == "cache.ring_rows");
  sc.cache.ring_rows = 8;
  sc.cache.layers = 100000;
  CHECK(estimate_run(sc, RunOptions{}).driver == "cache.layers");
}

TEST_CASE("MemoryEstimate: long steps drive the reference's rows, wide windows the recorded reads") {
  scenarios::Scenario sc = small();
  sc.steps[0].rows = 20000;
  CHECK(estimate_run(sc, RunOptions{}).driver == "steps");
  sc.cache.window = 4096;
  sc.cache.ring_rows = 20000;
  const MemoryEstimate recorded = estimate_run(sc, RunOptions{});
  CHECK(recorded.driver == "cache.window");
  RunOptions quiet;
  quiet.record_reads = false;  // what check runs with
  CHECK(estimate_run(sc, quiet).bytes < recorded.bytes / 4);
  // A replay keeps every run's observations but frees the rest between runs.
  const double one = estimate_replay({sc}, RunOptions{}).bytes;
  const double two = estimate_replay({sc, sc}, RunOptions{}).bytes;
  CHECK(two > one);
  CHECK(two < 2 * one);
}

TEST_CASE("MemoryEstimate: check grows with threads and the profile, not with cases") {
  const MemoryEstimate one = estimate_check(Profile::kDefault, 1);
  const MemoryEstimate eight = estimate_check(Profile::kDefault, 8);
  CHECK(eight.bytes > one.bytes);
  CHECK(eight.driver == "--threads");
  CHECK(estimate_check(Profile::kProduction, 2).bytes > estimate_check(Profile::kDefault, 2).bytes);
  CHECK(estimate_check(Profile::kProduction, 2).bytes < 2e9);
}

TEST_CASE("MemoryEstimate: --memory-limit takes bytes or K/M/G/T, refusals name the driving field") {
  CHECK(parse_memory_limit("--memory-limit", "4096") == 4096);
  CHECK(parse_memory_limit("--memory-limit", "3K") == 3072);
  CHECK(parse_memory_limit("--memory-limit", "2G") == std::int64_t{2} << 30);
  for (const char* bad : {"", "0", "-1", "1.5G", "G", "12X", "99999999999T"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_memory_limit("--memory-limit", bad), Error);
  }
  scenarios::Scenario sc = small();
  sc.cache.ring_rows = std::int64_t{1} << 26;
  const MemoryEstimate e = estimate_run(sc, RunOptions{});
  CHECK_NOTHROW(require_memory(e, std::int64_t{1} << 40, "test"));
  try {
    require_memory(e, std::int64_t{1} << 30, "--memory-limit");
    FAIL("not refused");
  } catch (const Error& err) {
    CHECK(err.id() == ErrorId::kMemory);
    CHECK(err.where() == "cache.ring_rows");
    CHECK(err.rule().find("6.4 GB") != std::string::npos);
  }
  std::string source;
  CHECK(available_memory_bytes(&source) > 0);
  CHECK_FALSE(source.empty());
}

TEST_CASE("MemoryEstimate: an exec or trace engine is not charged kvcheck's pool, its rows still are") {
  scenarios::Scenario sc = small();
  sc.cache.ring_rows = std::int64_t{1} << 40;  // 105 TB as kvcheck's own pool
  RunOptions exec;
  exec.backend = "exec:python3 adapter.py";
  CHECK(estimate_run(sc, RunOptions{}).bytes > 1e14);
  CHECK(estimate_run(sc, exec).bytes < 64e6);
  CHECK(backend_owns_pool("cpu"));
  CHECK(backend_owns_pool("layer"));
  CHECK_FALSE(backend_owns_pool("trace"));
  CHECK_FALSE(backend_owns_pool(exec.backend));
  // Wide rows are charged whatever the engine, named by the head count or size.
  sc.cache.ring_rows = 8;
  sc.cache.head_dim = 1 << 20;
  const MemoryEstimate wide = estimate_run(sc, exec);
  CHECK(wide.bytes > 1e9);
  CHECK(wide.driver == "cache.head_dim");
  sc.cache.head_dim = 1;
  sc.cache.q_heads = 1 << 22;
  sc.cache.kv_heads = 1;
  CHECK(estimate_run(sc, exec).driver == "cache.q_heads");
}

TEST_CASE("MemoryEstimate: reads beyond the bound are refused at the step that reads most") {
  scenarios::Scenario sc = small();
  sc.cache.window = 8192;
  sc.cache.ring_rows = 8192;
  sc.steps[0].rows = 2048;
  const WorkEstimate fits = estimate_replay_work({sc});
  CHECK(fits.reads == Approx(2048.0 * 2049 / 2 + 2049));  // the prefill's triangle, then the decode
  require_work(fits, "the replay");
  sc.steps[0].rows = 8192;
  const WorkEstimate big = estimate_replay_work({sc});
  CHECK(big.reads > kMaxReads);
  try {
    require_work(big, "the replay");
    FAIL("no refusal");
  } catch (const Error& e) {
    CHECK(e.id() == ErrorId::kSize);
    CHECK(e.where() == "steps[0].rows");
  }
  // A trace's block table counts its listed reads, capped by the window.
  scenarios::TraceRun run;
  run.header.window = std::int64_t{1} << 26;
  scenarios::TraceStep step;
  step.line = 2;
  step.block_table.seq_lens = {std::int64_t{1} << 26};
  run.steps = {step};
  const WorkEstimate recorded = estimate_audit_work({}, {run});
  CHECK(recorded.reads == double(std::int64_t{1} << 26));
  CHECK(recorded.driver == "line 2: block_table.seq_lens");
}

TEST_CASE("MemoryEstimate: a sweep's rows grow with its configurations, named by the widest flag") {
  SweepSize size;
  size.configurations = 40000.0 * 17 * 256 * 2;
  size.max_window = 40000;
  size.max_drafts = 16;
  size.max_chunk = 256;
  const MemoryEstimate e = estimate_sweep(size);
  CHECK(e.bytes > 80e9);
  CHECK(e.driver == "--window");
  size.configurations = 6528;  // the default grid
  size.max_window = 4096;
  CHECK(estimate_sweep(size).bytes < 64e6);
}
