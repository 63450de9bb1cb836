// `sweep --impl exec:...` on the bundled ring adapter: with its slots hidden
// (--no-slots) the sweep reads which rows each query saw from position-coded
// outputs (properties/position_code.hpp) and finds the same minimum
// capacities as with slots reported, bugs included; it runs a shape the
// adapter declares; and a configuration whose every capacity is refused is
// an `unsupported` row, not the end of the sweep.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "properties/runner.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/error.hpp"
#include "sweep/layer_minima.hpp"
#include "sweep/sweep.hpp"

using namespace kvcheck;
using namespace kvcheck::sweep;

namespace {

std::string ring_adapter(const std::string& flags) {
  return "exec:python3 " + std::string(KVCHECK_SOURCE_DIR) + "/adapters/ring_cache.py " + flags;
}

SweepResult live_sweep(const std::string& impl, const SweepGrid& grid) {
  SweepOptions o;
  o.impl = impl;
  o.counterexamples = CounterexampleMode::kNone;
  o.threads = 2;
  return run_sweep(grid, o);
}

SweepGrid small_grid() {
  SweepGrid g;
  g.windows = {3, 4};
  g.drafts = {0, 1, 2};
  g.chunks = {1, 3};  // C <= W: the hazards lose rows a later query reads
  g.orders = {SweepOrder::kStoreThenLoad, SweepOrder::kLoadThenStore};
  return g;
}

}  // namespace

TEST_CASE("Live sweep: an output-only ring adapter has the slot-reporting one's minima, bugs included") {
  const SweepGrid grid = small_grid();
  for (const std::string bug : {"", "--bug ring-sized-window"}) {
    const SweepResult slots = live_sweep(ring_adapter(bug), grid);
    const SweepResult outputs = live_sweep(ring_adapter(bug + " --no-slots"), grid);
    REQUIRE(slots.rows.size() == outputs.rows.size());
    std::int64_t short_of_spec = 0;
    for (std::size_t r = 0; r < slots.rows.size(); ++r) {
      const SweepRow& a = slots.rows[r];
      const SweepRow& b = outputs.rows[r];
      INFO("bug '" << bug << "' W=" << a.config.window_keys << " k=" << a.config.drafts
                   << " C=" << a.config.chunk_rows << " " << order_flag_name(a.config.order) << ": "
                   << a.below_hazard << " | " << b.below_hazard);
      CHECK(a.min_safe_ring == b.min_safe_ring);
      // Without slots a stale row read in a live row's place can decode as a
      // missing row plus an extra one rather than as overwritten, so with the
      // bug only the minima must agree; on the correct adapter the counts too.
      if (bug.empty()) CHECK(a.below_overwritten == b.below_overwritten);
      if (bug.empty()) CHECK(b.min_safe_ring == b.spec_bound);  // the outputs really found the hazards
      short_of_spec += b.min_safe_ring != b.spec_bound ? 1 : 0;
      CHECK(!b.unsupported);
    }
    // The bug needs more than the bound (or has no safe capacity) somewhere.
    if (!bug.empty()) CHECK(short_of_spec > 0);
  }
}

TEST_CASE("Live sweep: a window off by one has no safe capacity with or without slots") {
  SweepGrid g;
  g.windows = {3};
  g.drafts = {1};
  g.chunks = {1};
  g.orders = {SweepOrder::kStoreThenLoad};
  const SweepResult slots = live_sweep(ring_adapter("--bug window-plus-one"), g);
  const SweepResult outputs = live_sweep(ring_adapter("--bug window-plus-one --no-slots"), g);
  CHECK(slots.rows[0].min_safe_ring == -1);
  CHECK(outputs.rows[0].min_safe_ring == -1);
  CHECK(outputs.no_safe_rows == 1);
}

TEST_CASE("Live sweep: the schedule runs a head_dim the adapter declares") {
  // Multiples of 8 declared: the output-only sweep codes rows in heads of 8
  // (or more) and every capacity runs.
  const SweepResult r = live_sweep(ring_adapter("--no-slots --require-head-dim-multiple 8"), small_grid());
  CHECK(r.unsupported_rows == 0);
  for (const SweepRow& row : r.rows) {
    CHECK(row.refused_capacities == 0);
    CHECK(row.min_safe_ring == row.spec_bound);
  }
}

TEST_CASE("Live sweep: a configuration whose every capacity is refused is an unsupported row") {
  // The limit kept out of hello: the adapter refuses head_dim 2 at open.
  SweepGrid g = small_grid();
  g.windows = {3};
  const SweepResult r = live_sweep(ring_adapter("--require-head-dim-multiple 8 --undeclared-limits"), g);
  REQUIRE(r.rows.size() == g.drafts.size() * g.chunks.size() * g.orders.size());
  CHECK(r.unsupported_rows == static_cast<std::int64_t>(r.rows.size()));
  for (const SweepRow& row : r.rows) {
    CHECK(row.unsupported);
    CHECK(row.min_safe_ring == -1);
    CHECK(row.refused_capacities == row.probes);
    CHECK(row.refusal.find("multiple of 8") != std::string::npos);
  }
  CHECK(r.no_safe_rows == 0);  // refused is not unsafe
}

TEST_CASE("Sweep shape: one head of the smallest declared head_dim with slots, a code wide enough without") {
  engines::Capabilities caps;
  caps.head_dims.multiple_of = 8;
  SweepConfig c;
  c.window_keys = 20;
  c.drafts = 2;
  c.chunk_rows = 5;
  scenarios::Scenario sc = worst_case_scenario(c, 25, 2, caps);
  CHECK(sc.cache.head_dim == 8);
  CHECK(sc.cache.kv_heads == 1);
  CHECK(sc.data.profile == scenarios::ValueProfile::kUniform);
  caps.reports_read_slots = caps.reports_written_slots = false;
  sc = worst_case_scenario(c, 25, 2, caps);
  CHECK(sc.cache.head_dim % 8 == 0);
  CHECK(sc.data.profile == scenarios::ValueProfile::kPositionCode);
  // 25 positions a query can confuse: at least 25 (count, id) pairs.
  CHECK(std::int64_t{sc.cache.kv_heads} * sc.cache.head_dim / 2 >= 25);
  CHECK(sc.cache.q_heads == sc.cache.kv_heads);
}

TEST_CASE("Live sweep: a paged cache's minimum pool in blocks is ceil((m - 1) / B) + 1, freeing early has none") {
  SweepGrid grid;
  grid.windows = {3, 6};
  grid.drafts = {0, 2};
  grid.chunks = {1, 7};  // 7 > W + k: the chunk, not the window, sets m in load-then-store
  grid.orders = {SweepOrder::kStoreThenLoad, SweepOrder::kLoadThenStore};
  const std::string paged = "exec:python3 " + std::string(KVCHECK_SOURCE_DIR) + "/adapters/paged_cache.py --block-size 4";
  SweepOptions o;
  o.impl = paged;
  o.counterexamples = CounterexampleMode::kNone;
  o.formula = Formula::parse("(W - 1 + max(k + 1, C) + B - 1) / B + 1");  // the pool check gives per state
  const SweepResult good = run_sweep(grid, o);
  CHECK(good.block_size == 4);
  CHECK(good.spec_disagreements == 0);
  CHECK(good.formula_unsafe_rows == 0);
  for (const SweepRow& r : good.rows) {
    INFO("W=" << r.config.window_keys << " k=" << r.config.drafts << " C=" << r.config.chunk_rows << " "
              << order_flag_name(r.config.order) << ": " << r.below_hazard);
    CHECK(r.min_safe_ring == paged_bound(r.config, 4));
    CHECK(r.spec_bound == (spec_bound(r.config) - 1 + 3) / 4 + 1);
    // One block fewer runs out: the correct cache refuses, it loses nothing.
    REQUIRE(r.has_below);
    CHECK(r.below_ring == r.min_safe_ring - 1);
    CHECK(r.below_hazard.find("out-of-blocks") != std::string::npos);
  }
  o.impl = paged + " --bug free-early";
  o.formula.reset();
  SweepGrid few = grid;  // each row searches up to 4 * bound + 64 blocks: a few rows
  few.drafts = {2};
  few.chunks = {1};
  const SweepResult bad = run_sweep(few, o);
  CHECK(bad.spec_disagreements == static_cast<std::int64_t>(few.size()));
  CHECK(bad.no_safe_rows == static_cast<std::int64_t>(few.size()));
  // A ring sweep has no B.
  CHECK_THROWS_WITH(Formula::parse("W + B").evaluate(8, 0, 1), Catch::Contains("paged"));

  // The counterexample one block below the minimum is the schedule with its
  // pool (cache.pool_blocks): replayed, it fails; with one block more it passes.
  SweepGrid one;
  one.windows = {6};
  one.drafts = {2};
  one.chunks = {1};
  one.orders = {SweepOrder::kStoreThenLoad};
  o.impl = paged;
  o.counterexamples = CounterexampleMode::kAll;
  o.out_dir = std::filesystem::temp_directory_path() / "kvcheck-live-sweep-paged";
  std::filesystem::remove_all(o.out_dir);
  const SweepResult ce = run_sweep(one, o);
  REQUIRE(ce.rows.size() == 1);
  REQUIRE_FALSE(ce.rows[0].counterexample.empty());
  scenarios::Scenario sc = scenarios::load_scenario_file(ce.rows[0].counterexample);
  REQUIRE(sc.cache.pool_blocks == ce.rows[0].min_safe_ring - 1);
  properties::RunOptions run;
  run.backend = paged;
  run.check_outputs = false;
  CHECK_FALSE(properties::run_scenario(sc, run).passed);
  sc.cache.pool_blocks = ce.rows[0].min_safe_ring;
  CHECK(properties::run_scenario(sc, run).passed);
  std::filesystem::remove_all(o.out_dir);
}

TEST_CASE("Per-layer minima: the sliding and the global layers of a scenario are sized apart") {
  using namespace kvcheck;
  const auto sc = scenarios::load_scenario_file(std::string(KVCHECK_SOURCE_DIR) +
                                                "/scenarios/fast/layer-windows-w2-global-left3.json");
  properties::RunOptions options;
  const sweep::LayerMinima m = sweep::layer_minima(sc, options);
  CHECK(m.sliding_layers == std::vector<std::int32_t>{0, 2});
  CHECK(m.global_layers == std::vector<std::int32_t>{1});
  // A correct ring pool needs exactly the formulas: W + k for the widest
  // sliding layer, and every position written for the global one.
  CHECK(m.sliding_min == m.sliding_formula);
  CHECK(m.global_min == m.global_formula);
  CHECK(m.global_min > m.sliding_min);
  CHECK(m.global_formula == scenarios::schedule_end(sc.steps));
  // Between the two minima only the global layer loses rows.
  scenarios::Scenario between = sc;
  between.cache.ring_rows = m.sliding_min;
  between.expect.reset();
  const auto run = properties::run_scenario(between, options);
  bool sliding_failed = false, global_failed = false;
  for (const auto& s : run.steps) (s.layer == 1 ? global_failed : sliding_failed) |= s.failed;
  CHECK(global_failed);
  CHECK_FALSE(sliding_failed);
  CHECK(sweep::layer_minima_text(m).find("agree yes") != std::string::npos);
  // A scenario without layer windows is a usage error naming the flag.
  scenarios::Scenario plain = sc;
  plain.cache.layer_windows.clear();
  plain.cache.layers = 1;
  try {
    (void)sweep::layer_minima(plain, options);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.where() == "--layers-of");
  }
  // A cache that declares no window per layer runs the scenario at no
  // capacity: an error saying so, not "no safe capacity, agree NO".
  properties::RunOptions layer_cache;
  layer_cache.backend = "layer";
  try {
    (void)sweep::layer_minima(sc, layer_cache);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.where() == "--layers-of");
    CHECK(std::string(e.what()).find("cache.layer_windows") != std::string::npos);
  }
}

TEST_CASE("Live sweep: --impl paged, a ring laid over a block table, needs ceil(m / B) blocks") {
  SweepGrid grid;
  grid.windows = {3, 6};
  grid.drafts = {0, 2};
  grid.chunks = {1, 7};
  grid.orders = {SweepOrder::kStoreThenLoad, SweepOrder::kLoadThenStore};
  SweepOptions o;
  o.impl = "paged";
  o.counterexamples = CounterexampleMode::kNone;
  const SweepResult r = run_sweep(grid, o);
  REQUIRE(r.block_size > 0);
  CHECK(r.spec_disagreements == 0);
  std::int64_t below_bound = 0;
  for (const SweepRow& row : r.rows) {
    INFO("W=" << row.config.window_keys << " k=" << row.config.drafts << " C=" << row.config.chunk_rows << " "
              << order_flag_name(row.config.order) << ": " << row.below_hazard);
    CHECK(row.min_safe_ring == paged_ring_bound(row.config, r.block_size));
    CHECK(row.min_safe_ring <= row.spec_bound);
    below_bound += row.min_safe_ring < row.spec_bound ? 1 : 0;
  }
  CHECK(below_bound > 0);  // it holds a block less than a cache that frees what the window left
}
