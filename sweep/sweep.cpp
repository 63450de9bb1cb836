// The capacity sweep: the grid, the galloping search, the worst-case
// schedule as a scenario for caches driven through the step-level interface
// (live probes through properties/), counterexample files and their replay,
// and the threaded run over the grid. The probes through RingPool over the
// CPU kernels are ring_probe.cpp. See sweep.hpp for why the schedules are
// worst cases.
#include "sweep/sweep.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <system_error>
#include <thread>

#include "engines/cache_under_test.hpp"
#include "model/real.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/assert.hpp"
#include "support/error.hpp"

namespace kvcheck::sweep {

using scenarios::StepKind;

const char* order_flag_name(SweepOrder order) noexcept {
  return order == SweepOrder::kStoreThenLoad ? "store-then-load" : "load-then-store";
}

const char* order_file_name(SweepOrder order) noexcept {
  return order == SweepOrder::kStoreThenLoad ? "store_then_load" : "load_then_store";
}

std::int64_t SweepGrid::size() const noexcept {
  return static_cast<std::int64_t>(windows.size() * drafts.size() * chunks.size() * orders.size());
}

SweepConfig SweepGrid::at(std::int64_t row) const {
  KVCHECK_ASSERT(row >= 0 && row < size());
  auto r = static_cast<std::size_t>(row);
  SweepConfig c;
  c.order = orders[r % orders.size()];
  r /= orders.size();
  c.chunk_rows = chunks[r % chunks.size()];
  r /= chunks.size();
  c.drafts = drafts[r % drafts.size()];
  r /= drafts.size();
  c.window_keys = windows[r];
  return c;
}

SweepGrid default_grid() {
  SweepGrid g;
  for (std::int64_t w = 64; w <= 4096; w += 64) g.windows.push_back(w);
  for (std::int64_t k = 0; k <= 16; ++k) g.drafts.push_back(k);
  g.chunks = {1, 16, 256};
  g.orders = {SweepOrder::kStoreThenLoad, SweepOrder::kLoadThenStore};
  return g;
}

namespace {

// Largest ring a search may probe: far above any W + max(k + 1, C) the flags
// allow, so reaching it means the backend never became safe.
constexpr std::int64_t kMaxProbeRing = std::int64_t{1} << 26;

/// Galloping from `guess`, then binary search, for the smallest S with
/// probe(S).safe; relies on monotonicity in S (argument 7 above).
/// Returns -1 when even `max_ring` is unsafe (`below` then holds that probe).
template <class Probe>
std::int64_t gallop_search(std::int64_t guess, Probe&& probe_at, ProbeResult* below, SearchStats* stats,
                           std::int64_t max_ring = kMaxProbeRing) {
  std::int64_t lo = 0;   // largest ring known unsafe (0: not a ring)
  std::int64_t hi = -1;  // smallest ring known safe
  ProbeResult lo_result;
  auto probe = [&](std::int64_t s) {
    KVCHECK_ASSERT(s >= 1 && s <= kMaxProbeRing);
    if (stats) ++stats->probes;
    ProbeResult r = probe_at(s);
    if (r.safe) {
      hi = hi < 0 ? s : std::min(hi, s);
      return true;
    }
    if (s > lo) {
      lo = s;
      lo_result = std::move(r);
    }
    return false;
  };
  const std::int64_t start = std::max<std::int64_t>(1, guess);
  if (probe(start)) {
    for (std::int64_t step = 1; hi - step > lo; step *= 2) {
      if (!probe(hi - step)) break;
    }
  } else {
    for (std::int64_t step = 1;; step *= 2) {
      if (probe(std::min(lo + step, max_ring))) break;
      if (lo >= max_ring) {
        if (below) *below = std::move(lo_result);
        return -1;
      }
    }
  }
  while (hi - lo > 1) probe(lo + (hi - lo) / 2);
  if (below && lo >= 1) *below = std::move(lo_result);
  return hi;
}

}  // namespace

std::int64_t find_min_safe_ring(const SweepConfig& config, std::int64_t guess, const ProbeOptions& options,
                                ProbeResult* below, SearchStats* stats) {
  return gallop_search(
      guess, [&](std::int64_t s) { return probe_ring(config, s, options); }, below, stats);
}

void sweep_shape(const SweepConfig& config, std::int64_t ring_rows, std::int64_t states,
                 const engines::Capabilities& caps, scenarios::Scenario* sc) {
  scenarios::CacheConfig c = sc->cache;
  c.window = config.window_keys;
  c.convention = scenarios::Convention::kKeys;
  c.ring_rows = ring_rows;
  c.states = states;
  c.rope = scenarios::Rope{};
  c.shared_row = false;
  const std::int64_t step_rows = std::max(config.drafts + 1, config.chunk_rows);
  auto accepts = [&](std::int32_t heads, std::int32_t head_dim) {
    scenarios::CacheConfig t = c;
    t.q_heads = t.kv_heads = heads;
    t.head_dim = head_dim;
    return caps.supports(t, step_rows, nullptr);
  };
  constexpr std::int32_t kHeadDims[] = {2, 4, 8, 16, 32, 64, 128, 256};
  const bool coded = !caps.reports_read_slots && caps.computes_outputs;
  // Classes wanted: every position a query can confuse (its window, the
  // drafts or chunk beyond it) in a class of its own; more only cost bytes.
  const std::int64_t wanted = std::min<std::int64_t>(128, config.window_keys + step_rows);
  std::int32_t best_heads = 0, best_dim = 0;
  std::int64_t best_classes = -1;
  for (const std::int32_t d : kHeadDims) {
    if (!coded) {
      if (accepts(1, d)) {
        best_heads = 1;
        best_dim = d;
        break;
      }
      continue;
    }
    // Heads to reach `wanted` pairs of code elements, else as many as accepted.
    auto heads = static_cast<std::int32_t>(std::clamp<std::int64_t>((2 * wanted + d - 1) / d, 1, 64));
    while (heads > 1 && !accepts(heads, d)) heads = heads / 2;
    if (!accepts(heads, d)) continue;
    const std::int64_t classes = std::int64_t{heads} * d / 2;
    if (classes > best_classes) {
      best_classes = classes;
      best_heads = heads;
      best_dim = d;
    }
    if (classes >= wanted) break;
  }
  if (best_heads == 0) {
    best_heads = 1;
    best_dim = 2;
  }
  sc->cache.q_heads = sc->cache.kv_heads = best_heads;
  sc->cache.head_dim = best_dim;
  if (coded) sc->data.profile = scenarios::ValueProfile::kPositionCode;
}

namespace {

/// The step shapes of a worst-case schedule: decode, prefill(C) in the
/// configuration's order, verify(k).
struct ProbeSteps {
  scenarios::Step decode;
  scenarios::Step prefill;
  scenarios::Step verify;
};

ProbeSteps probe_steps(const SweepConfig& config) {
  ProbeSteps s;
  s.decode.kind = StepKind::kDecode;
  s.prefill.kind = StepKind::kPrefill;
  s.prefill.order = config.order == SweepOrder::kStoreThenLoad ? scenarios::Order::kStoreThenLoad
                                                               : scenarios::Order::kLoadThenStore;
  s.prefill.rows = config.chunk_rows;
  s.verify.kind = StepKind::kVerify;
  s.verify.drafts = config.drafts;
  return s;
}

/// One step of a fill: a load_then_store prefill of `rows` rows, or a decode
/// when the cache does not take it.
scenarios::Step fill_step(std::int64_t rows, const engines::Capabilities& caps) {
  scenarios::Step st;
  st.kind = StepKind::kPrefill;
  st.order = scenarios::Order::kLoadThenStore;
  st.rows = rows;
  if (!caps.supports_step(st) || (caps.max_step_rows > 0 && st.rows > caps.max_step_rows)) {
    st = scenarios::Step{};
    st.kind = StepKind::kDecode;
  }
  return st;
}

/// A live worst-case scenario before its requests and steps: `name`, the
/// cache at `capacity` rows on `states` states, in a shape the cache declares.
scenarios::Scenario live_frame(const SweepConfig& config, std::int64_t capacity, std::int64_t states,
                               const engines::Capabilities& caps, std::string name, std::string description) {
  scenarios::Scenario sc;
  sc.name = std::move(name);
  sc.description = std::move(description);
  sc.cache.window = config.window_keys;
  sc.cache.convention = scenarios::Convention::kKeys;
  sc.cache.ring_rows = capacity;
  sc.cache.states = states;
  sc.cache.format = caps.formats.empty() ? scenarios::Format::kF64 : caps.formats.front();
  sc.data.seed = 1;
  sweep_shape(config, capacity, states, caps, &sc);
  return sc;
}

/// "W=.., k=.., C=.., order" of a configuration.
std::string config_text(const SweepConfig& config) {
  return "W=" + std::to_string(config.window_keys) + ", k=" + std::to_string(config.drafts) +
         ", C=" + std::to_string(config.chunk_rows) + ", " + order_file_name(config.order);
}

}  // namespace

scenarios::Scenario worst_case_scenario(const SweepConfig& config, std::int64_t ring_rows,
                                        std::int64_t states, const engines::Capabilities& caps) {
  scenarios::Scenario sc = live_frame(
      config, ring_rows, states, caps,
      "sweep-live-w" + std::to_string(config.window_keys) + "-k" + std::to_string(config.drafts) + "-c" +
          std::to_string(config.chunk_rows) + "-" + order_file_name(config.order) + "-s" +
          std::to_string(ring_rows),
      "kvcheck sweep worst-case schedule at capacity " + std::to_string(ring_rows) + " (" + config_text(config) +
          ")");
  const auto [decode, prefill, verify] = probe_steps(config);
  std::vector<scenarios::Step> program;
  auto add = [&](scenarios::Step st) {
    if (caps.supports_step(st)) program.push_back(st);
  };
  const std::int64_t fill = history_rows(config.window_keys, ring_rows, 0);
  const std::int64_t chunk = std::min(config.window_keys, ring_rows);
  for (std::int64_t done = 0; done < fill;) {
    program.push_back(fill_step(std::min(chunk, fill - done), caps));
    done += scenarios::step_rows(program.back());
  }
  add(decode);
  add(prefill);
  for (std::int64_t a = 0; a <= config.drafts && caps.verify; ++a) {
    scenarios::Step accept;
    accept.kind = StepKind::kAccept;
    accept.accepted = a;
    for (const auto& then : {decode, prefill}) {
      add(verify);
      add(accept);
      add(then);
    }
  }
  for (std::int64_t b = 0; b < states; ++b) sc.requests.push_back(scenarios::Request{b, b});
  for (const auto& st : program) {
    for (std::int64_t b = 0; b < states; ++b) {
      scenarios::Step mine = st;
      mine.request = b;
      sc.steps.push_back(mine);
    }
  }
  return sc;
}

namespace {

/// The longest step of `config`: verify(k)'s k + 1 rows or a chunk of C.
std::int64_t longest_step_rows(const SweepConfig& config) noexcept {
  return std::max(config.drafts + 1, config.chunk_rows);
}

}  // namespace

std::int64_t paged_bound(const SweepConfig& config, std::int64_t block_size,
                         const engines::Capabilities& caps) noexcept {
  const std::int64_t step = longest_step_rows(config);
  // A deferral lets rows wait through a step in either order (store-first),
  // and N steps' worth of rows past it.
  const std::int64_t rows =
      (caps.free_deferral_steps ? config.window_keys - 1 + step + *caps.free_deferral_steps * step
                                : spec_bound(config)) +
      caps.lookahead_slots;
  return (rows - 1 + block_size - 1) / block_size + 1;
}

std::int64_t paged_ring_bound(const SweepConfig& config, std::int64_t block_size) noexcept {
  return (spec_bound(config) + block_size - 1) / block_size;
}

std::int64_t paged_default_pool(const SweepConfig& config, std::int64_t block_size,
                                const engines::Capabilities& caps) noexcept {
  engines::CacheSpec spec;
  spec.cache.states = 1;
  spec.cache.ring_rows = spec_bound(config);
  spec.window_keys = config.window_keys;
  spec.max_step_rows = longest_step_rows(config);
  return engines::paged_pool_blocks(spec, block_size, engines::pool_slack_rows(caps, spec));
}

scenarios::Scenario worst_case_paged_scenario(const SweepConfig& config, std::int64_t block_size,
                                              std::int64_t states, const engines::Capabilities& caps) {
  KVCHECK_ASSERT(block_size >= 1 && states >= 1);
  const std::int64_t capacity = spec_bound(config);
  // One live request: each takes the one state the request before it freed.
  scenarios::Scenario sc = live_frame(
      config, capacity, 1, caps,
      "sweep-paged-w" + std::to_string(config.window_keys) + "-k" + std::to_string(config.drafts) + "-c" +
          std::to_string(config.chunk_rows) + "-" + order_file_name(config.order) + "-b" + std::to_string(block_size),
      "kvcheck sweep worst-case schedule for a paged cache of blocks of " + std::to_string(block_size) +
          " rows (" + config_text(config) + ")");
  const auto [decode, prefill, verify] = probe_steps(config);
  // One request live at a time: each finishes before the next begins (a
  // cache without finish runs every phase on one request).
  const std::int64_t requests = caps.finish ? std::min(states, block_size) : 1;
  for (std::int64_t b = 0; b < requests; ++b) sc.requests.push_back(scenarios::Request{b, 0});
  const std::int64_t fill = config.window_keys + 2 * block_size;
  for (std::int64_t b = 0; b < requests; ++b) {
    std::int64_t length = 0;  // the request's committed length
    auto push = [&](scenarios::Step st, std::int64_t advance) {
      st.request = b;
      sc.steps.push_back(st);
      length += advance;
    };
    auto add = [&](const scenarios::Step& st, std::int64_t advance) {
      if (caps.supports_step(st)) push(st, advance);
    };
    // A deferral's slack is N steps of the longest step's rows: the fill's
    // chunks are no longer than that step, or they would outgrow it.
    const std::int64_t chunk = std::min(
        {config.window_keys, capacity, caps.free_deferral_steps ? longest_step_rows(config) : capacity});
    while (length < fill) {
      const scenarios::Step st = fill_step(std::min(chunk, fill - length), caps);
      push(st, scenarios::step_rows(st));
    }
    for (std::int64_t phase = b; phase < block_size; phase += requests) {
      // Decodes to the phase: the steps below then start at fill + phase mod B.
      while (caps.supports_step(decode) && (length - fill - phase) % block_size != 0) push(decode, 1);
      add(decode, 1);
      add(prefill, config.chunk_rows);
      for (std::int64_t a = 0; a <= config.drafts && caps.verify; ++a) {
        scenarios::Step accept;
        accept.kind = StepKind::kAccept;
        accept.accepted = a;
        for (const bool then_decode : {true, false}) {
          push(verify, 0);
          push(accept, 1 + a);
          if (then_decode) {
            add(decode, 1);
          } else {
            add(prefill, config.chunk_rows);
          }
        }
      }
      if (caps.free_deferral_steps) {
        // Rows left behind by the last N steps stay: 2N + 2 of the longest
        // steps in a row hold a whole cycle of N + 1 between two frees.
        scenarios::Step accept;
        accept.kind = StepKind::kAccept;
        accept.accepted = config.drafts;
        const bool chunks = config.chunk_rows >= config.drafts + 1 && caps.supports_step(prefill);
        for (std::int64_t i = 0; i < 2 * *caps.free_deferral_steps + 2; ++i) {
          if (chunks) {
            push(prefill, config.chunk_rows);
          } else if (caps.verify) {
            push(verify, 0);
            push(accept, config.drafts + 1);
          }
        }
      }
    }
    if (caps.finish && b + 1 < requests) {
      scenarios::Step finish;
      finish.kind = StepKind::kFinish;
      push(finish, 0);
    }
  }
  return sc;
}

namespace {

/// One live probe: the worst-case scenario at capacity S through the runner
/// (slot observations only: outputs are the check's business).
ProbeResult probe_scenario(const scenarios::Scenario& sc, std::int64_t ring_rows, properties::RunOptions run);

ProbeResult probe_live(const SweepConfig& config, std::int64_t ring_rows, const ProbeOptions& probe,
                       properties::RunOptions run) {
  return probe_scenario(worst_case_scenario(config, ring_rows, probe.states, run.provider->capabilities()),
                        ring_rows, std::move(run));
}

/// One probe of a paged cache: its worst-case schedule with a pool of
/// `pool_blocks` blocks per layer.
ProbeResult probe_paged(const scenarios::Scenario& sc, std::int64_t pool_blocks, properties::RunOptions run) {
  scenarios::Scenario at = sc;
  at.cache.pool_blocks = pool_blocks;
  return probe_scenario(at, pool_blocks, std::move(run));
}

ProbeResult probe_scenario(const scenarios::Scenario& sc, std::int64_t ring_rows, properties::RunOptions run) {
  run.record_reads = false;
  run.record_ring = false;
  run.check_outputs = false;
  run.probes = false;
  const properties::RunObservation obs = properties::run_scenario(sc, run);
  if (obs.crashed) {
    // A crash is a finding of a check; here it would read as an unsafe
    // capacity and steer the search, so the sweep stops, as it always has.
    throw Error(ErrorId::kAdapter, "sweep probe at ring " + std::to_string(ring_rows), obs.first_failure);
  }
  ProbeResult r;
  r.ring_rows = ring_rows;
  if (obs.skipped) {
    // The cache cannot run this capacity (or this configuration at all): a
    // result of the row, not the end of the sweep.
    r.safe = false;
    r.refused = true;
    r.refusal = obs.skip_reason;
    return r;
  }
  r.safe = obs.passed;
  r.steps_checked = static_cast<std::int64_t>(obs.steps.size());
  if (!obs.passed) {
    r.hazard = obs.first_failure;
    if (obs.first_failing_step >= 0) {
      const auto& step = obs.steps[static_cast<std::size_t>(obs.first_failing_step)];
      for (const auto& q : step.queries)
        r.overwritten.push_back(static_cast<std::int64_t>(q.overwritten.size()));
      r.collisions.same_step = step.collisions.same_step;
      r.collisions.outside_block = step.collisions.outside_block;
      r.collisions.replaced_needed = step.collisions.replaced_needed;
      for (const auto& q : step.queries) {
        r.extra_reads += static_cast<std::int64_t>(q.extra.size());
        if (r.first_lost.empty() && !q.overwritten.empty()) {
          for (const auto j : q.overwritten) r.first_lost.push_back(j - q.position);
        }
      }
    }
  }
  return r;
}

}  // namespace

std::int64_t find_min_safe_ring_linear(const SweepConfig& config, const ProbeOptions& options,
                                       ProbeResult* below, SearchStats* stats) {
  ProbeResult last_unsafe;
  std::int64_t s = config.window_keys;
  for (;; ++s) {
    if (stats) ++stats->probes;
    ProbeResult r = probe_ring(config, s, options);
    if (r.safe) break;
    last_unsafe = std::move(r);
  }
  if (s == config.window_keys && s > 1) {
    // Safe at W: S = W - 1 still needs a probe for the report below the minimum.
    if (stats) ++stats->probes;
    ProbeResult r = probe_ring(config, s - 1, options);
    KVCHECK_ASSERT(!r.safe);
    last_unsafe = std::move(r);
  }
  if (below && s > 1) *below = std::move(last_unsafe);
  return s;
}

std::int64_t spec_bound(const SweepConfig& c) noexcept {
  if (c.order == SweepOrder::kStoreThenLoad) {
    return std::max(c.window_keys + c.drafts, c.window_keys + c.chunk_rows - 1);
  }
  return std::max(c.window_keys + c.drafts, c.chunk_rows);
}

std::int64_t seed_ring(const SweepConfig& c) noexcept {
  return c.window_keys + std::max<std::int64_t>(0, c.drafts + 1);
}

namespace {

/// Builds, writes and replays the counterexample of one row.
void counterexample_for(const SweepOptions& options, const ProbeResult& below, SweepRow* row) {
  const auto sc = make_counterexample(row->config, row->below_ring, below);
  if (!sc) {
    row->replay_ok = false;
    row->replay_detail = "the failing path did not fail again from a fresh fill";
    return;
  }
  const std::filesystem::path path = options.out_dir / (sc->name + ".json");
  scenarios::write_scenario_file(path, *sc);
  row->counterexample = path.string();
  // The hazard step must show what the probe saw (argument 3: phase does not matter).
  const std::size_t hazard_step = sc->steps.size() - 1;
  std::vector<std::int64_t> expected(row->below_overwritten.size(), 0);
  for (const auto& e : sc->expect->overwritten) {
    if (e.step == static_cast<std::int64_t>(hazard_step)) expected = e.counts;
  }
  if (expected != row->below_overwritten) {
    row->replay_ok = false;
    row->replay_detail = "the counterexample's hazard step lost a different number of rows than the probe";
    return;
  }
  if (row->config.window_keys > kReplayWindowLimit) return;
  properties::RunOptions run;
  run.backend = "cpu";
  run.record_reads = false;
  run.record_ring = false;
  run.check_outputs = false;
  const properties::RunObservation obs = properties::run_scenario(*sc, run);
  row->replayed = true;
  row->replay_ok = obs.passed;
  if (!obs.passed) row->replay_detail = obs.first_failure;
}

}  // namespace

SweepResult run_sweep(const SweepGrid& grid, const SweepOptions& options) {
  SweepResult result;
  result.grid = grid;
  result.states = options.probe.states;
  const std::int64_t total = grid.size();
  engines::Capabilities live_caps;  // a live cache's, for its declared slack
  if (!options.impl.empty() && total > 0) {
    // A live cache that declares paged addressing is swept for its pool in blocks.
    properties::RunOptions ask;
    ask.backend = options.impl;
    ask.step_timeout_seconds = options.step_timeout_seconds;
    live_caps = properties::make_provider(ask)->capabilities();
    result.block_size = live_caps.block_size;
  }
  const std::int64_t block_size = result.block_size;
  result.rows.resize(static_cast<std::size_t>(total));
  for (std::int64_t r = 0; r < total; ++r) {
    SweepRow& row = result.rows[static_cast<std::size_t>(r)];
    row.config = grid.at(r);
    row.spec_bound = block_size > 0 ? paged_bound(row.config, block_size, live_caps) : spec_bound(row.config);
    row.seed_ring =
        block_size > 0 ? paged_default_pool(row.config, block_size, live_caps) : seed_ring(row.config);
    // Evaluated up front so a bad formula fails before any work, the same way every time.
    if (options.formula) {
      row.has_formula = true;
      row.formula_ring = options.formula->evaluate(row.config.window_keys, row.config.drafts,
                                                   row.config.chunk_rows, block_size);
    }
  }
  const bool write_files =
      options.counterexamples == CounterexampleMode::kAll ||
      (options.counterexamples == CounterexampleMode::kAuto && total <= kAutoCounterexampleRows);
  if (write_files && total > 0) {
    std::error_code ec;
    std::filesystem::create_directories(options.out_dir, ec);
    if (ec || !std::filesystem::is_directory(options.out_dir)) {
      throw Error(ErrorId::kIo, options.out_dir.string(),
                  "cannot create the counterexample directory: " + ec.message());
    }
  }

  // Units: one (drafts, chunk, order) column over all windows, searched in
  // window order by one thread, each search starting at the previous
  // window's minimum shifted by the window step (a guess only: the answer is
  // certified by a safe probe at S and an unsafe one at S - 1).
  const std::size_t per_window = grid.drafts.size() * grid.chunks.size() * grid.orders.size();
  // This shard's columns: u = shard_index + j * shard_count.
  KVCHECK_ASSERT(options.shard_count >= 1 && options.shard_index >= 0 &&
                 options.shard_index < options.shard_count);
  const auto shard_index = static_cast<std::size_t>(options.shard_index);
  const auto shard_count = static_cast<std::size_t>(options.shard_count);
  const std::size_t units =
      total > 0 && shard_index < per_window ? (per_window - shard_index + shard_count - 1) / shard_count : 0;
  const std::int64_t shard_total = static_cast<std::int64_t>(units * grid.windows.size());
  std::atomic<std::size_t> next_unit{0};
  std::atomic<std::int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  std::exception_ptr error;
  std::int64_t error_row = total;

  auto work = [&] {
    // A live cache (`--impl`): one provider (one adapter process) per worker.
    std::unique_ptr<engines::CacheProvider> provider;
    properties::RunOptions live;
    for (;;) {
      const std::size_t j = next_unit.fetch_add(1);
      if (j >= units) break;
      const std::size_t u = shard_index + j * shard_count;
      std::int64_t prev_window = -1, prev_min = -1;
      for (std::size_t wi = 0; wi < grid.windows.size(); ++wi) {
        const auto r = static_cast<std::int64_t>(wi * per_window + u);
        SweepRow& row = result.rows[static_cast<std::size_t>(r)];
        try {
          ProbeResult below;
          SearchStats stats;
          if (!options.impl.empty()) {
            if (!provider) {
              live.backend = options.impl;
              live.step_timeout_seconds = options.step_timeout_seconds;
              provider = properties::make_provider(live);
              live.provider = provider.get();
            }
            // A paged cache: the search is over its pool in blocks, from the bound.
            const std::int64_t guess =
                block_size > 0 ? row.spec_bound
                : prev_min < 0 ? row.config.window_keys
                               : prev_min + (row.config.window_keys - prev_window);
            // A live cache may have no safe capacity at all (a bug that loses
            // rows at any size): stop at a generous multiple of the bound.
            const std::int64_t limit = 4 * row.spec_bound + 64;
            std::optional<scenarios::Scenario> paged;
            if (block_size > 0)
              paged = worst_case_paged_scenario(row.config, block_size, options.probe.states, provider->capabilities());
            row.min_safe_ring = gallop_search(
                guess,
                [&](std::int64_t s) {
                  ProbeResult pr = paged ? probe_paged(*paged, s, live)
                                         : probe_live(row.config, s, options.probe, live);
                  if (pr.refused) {
                    if (row.refused_capacities++ == 0)
                      row.refusal = "S=" + std::to_string(s) + ": " + pr.refusal;
                  }
                  return pr;
                },
                &below, &stats, limit);
            if (row.min_safe_ring < 0 && row.refused_capacities == stats.probes) {
              // Not one capacity ran: the configuration is unsupported.
              row.probes = stats.probes;
              row.unsupported = true;
              prev_min = -1;
              done.fetch_add(1);
              continue;
            }
            if (row.min_safe_ring < 0) {
              row.probes = stats.probes;
              row.has_below = true;
              row.below_ring = limit;
              row.below_hazard = "no safe capacity up to " + std::to_string(limit) + ": " + below.hazard;
              row.below_overwritten = below.overwritten;
              prev_min = -1;
              done.fetch_add(1);
              continue;
            }
          } else if (options.linear_search) {
            row.min_safe_ring = find_min_safe_ring_linear(row.config, options.probe, &below, &stats);
          } else {
            const std::int64_t guess =
                prev_min < 0 ? row.config.window_keys : prev_min + (row.config.window_keys - prev_window);
            row.min_safe_ring = find_min_safe_ring(row.config, guess, options.probe, &below, &stats);
          }
          prev_window = row.config.window_keys;
          prev_min = row.min_safe_ring;
          row.probes = stats.probes;
          row.spec_agrees = row.spec_bound == row.min_safe_ring ||
                            (block_size > 0 && row.min_safe_ring == paged_ring_bound(row.config, block_size));
          if (row.has_formula) row.formula_safe = row.formula_ring >= row.min_safe_ring;
          if (row.min_safe_ring > 1) {
            row.has_below = true;
            row.below_ring = row.min_safe_ring - 1;
            row.below_hazard = below.hazard;
            row.below_overwritten = below.overwritten;
            row.below_first_lost = below.first_lost;
            row.below_collisions = below.collisions.total();
            if (below.refused) row.below_hazard = "refused: " + below.refusal;
            if (write_files && options.impl.empty()) counterexample_for(options, below, &row);
            if (write_files && !options.impl.empty() && !below.refused) {
              // Live: the worst-case schedule at S_min - 1 is the counterexample
              // (a paged cache's with its pool of S_min - 1 blocks).
              scenarios::Scenario sc =
                  block_size > 0
                      ? worst_case_paged_scenario(row.config, block_size, options.probe.states,
                                                  provider->capabilities())
                      : worst_case_scenario(row.config, row.below_ring, options.probe.states,
                                            provider->capabilities());
              if (block_size > 0) {
                sc.cache.pool_blocks = row.below_ring;
                sc.name += "-n" + std::to_string(row.below_ring);
                sc.description += ", pool of " + std::to_string(row.below_ring) + " blocks";
              }
              const std::filesystem::path path = options.out_dir / (sc.name + ".json");
              scenarios::write_scenario_file(path, sc);
              row.counterexample = path.string();
            }
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (r < error_row) {
            error_row = r;
            error = std::current_exception();
          }
        }
        done.fetch_add(1);
      }
    }
    model::release_thread_caches();  // counterexample replays ran the model here
    std::lock_guard<std::mutex> lock(mu);
    --running;
    cv.notify_all();
  };

  const int threads = std::max(1, options.threads);
  std::vector<std::thread> pool;
  {
    std::lock_guard<std::mutex> lock(mu);
    running = threads;
  }
  for (int t = 0; t < threads; ++t) pool.emplace_back(work);
  {
    std::unique_lock<std::mutex> lock(mu);
    while (running > 0) {
      cv.wait_for(lock, std::chrono::milliseconds(100));
      if (options.progress) {
        lock.unlock();
        options.progress(done.load(), shard_total);
        lock.lock();
      }
    }
  }
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  if (options.progress) options.progress(shard_total, shard_total);

  if (options.formula) result.formula = options.formula->text();
  summarize_sweep(result);
  return result;
}

bool sweep_row_in_shard(const SweepGrid& grid, std::int64_t row, std::int64_t index,
                        std::int64_t count) noexcept {
  const auto per_window =
      static_cast<std::int64_t>(grid.drafts.size() * grid.chunks.size() * grid.orders.size());
  return per_window > 0 && (row % per_window) % count == index;
}

void summarize_sweep(SweepResult& result) {
  result.probes = 0;
  result.spec_disagreements = 0;
  result.formula_unsafe_rows = 0;
  result.replay_failures = 0;
  result.no_safe_rows = 0;
  result.unsupported_rows = 0;
  for (const SweepRow& row : result.rows) {
    result.probes += row.probes;
    if (row.unsupported) {
      ++result.unsupported_rows;
      continue;
    }
    if (!row.spec_agrees) ++result.spec_disagreements;
    if (row.has_formula && !row.formula_safe) ++result.formula_unsafe_rows;
    if (!row.replay_ok) ++result.replay_failures;
    if (row.min_safe_ring < 0) ++result.no_safe_rows;
  }
}

}  // namespace kvcheck::sweep
