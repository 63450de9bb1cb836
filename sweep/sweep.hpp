// The capacity sweep: for each (window W, drafts k, chunk C, prefill order)
// the smallest ring S that loses no visible row, found by running RingPool
// over the CPU kernels (with tags) on worst-case schedules (the pool and
// steps `check --impl cpu` runs), never by evaluating the docs/semantics.md "Safe capacity" formula
// (which is reported beside it, with whether it agreed).
//
// Why the schedules run by probe_ring() are the worst cases (the argument is
// backed by tests/sweep/sweep_test.cpp, which runs randomized
// schedules through the full runner at the reported minimum, every ring
// phase, and every S below and above the minimum):
//
//  1. Canonical pool state. Before any step the block of a request at
//     logical length L holds, per slot x, the latest write of the largest
//     position < L congruent to x (mod S), plus at most k stale rejected
//     drafts at positions L .. L+t-1 after an accept. So the state a step
//     meets is fixed by (L mod S, t): the history that led there is
//     irrelevant, and a probe writes any history (here positions 0..p0-1, two
//     or more full wraps) and then runs every step kind from it. After a
//     case the probe makes the state canonical again by writing forward
//     (a pending verify accepted whole, the stale drafts written over),
//     which by argument 3 is the state the case started from.
//  2. Full window. A window clipped at position 0 reads a subset of the
//     slots a full window reads, so windows are full (p0 >= W + S).
//  3. Phase. Once p0 >= S, adding 1 to every position adds 1 (mod S) to every
//     slot: the pairs (query, lost position) translate, so whether a step
//     loses rows does not depend on p0 mod S. Probes still start each state
//     at its own phase (0: the step starts at slot 0; S-1: the step
//     straddles the seam) to exercise the wrap, later cases start where the
//     one before left the ring, and a test compares against every phase.
//  4. Step size. A step that stores n rows before its queries read destroys
//     the rows whose slots its n writes take; a shorter step of the same kind
//     destroys a subset while each query reads the same window. So verify(k)
//     with all k drafts and prefill chunks of exactly C dominate shorter ones,
//     and decode (one row) is run as its own case. load_then_store reads the
//     window it loaded before the store, so only a same-step collision
//     (C > S) or a later step can lose rows there.
//  5. Rollback. accept(a) leaves k - a stale drafts whose writes destroyed
//     older rows; the next step's first query reads the window that reaches
//     furthest back over them, and every later step rewrites more of the
//     stale tail. So verify(k), accept(a) for every a in 0..k, then each step
//     kind (decode, verify(k), prefill(C)) is the worst rollback schedule.
//  6. States. A step writes only slots of its own block (checked on every
//     write), so steps of other states cannot touch a block; probes run
//     `states` states with their steps interleaved and check every read.
//  7. Monotonicity in S. Writing position q destroys position q - S (its
//     nearest live victim); a smaller S moves the victim later, into more
//     windows, and a same-step collision needs n > S. So safe(S) implies
//     safe(S + 1), and the minimum can be found by galloping/binary search
//     (a test checks every S in a range against the search).
//
// Speed: a step's queries all read after its stores (or, load_then_store,
// from one scratch copy of the old window and the new rows), and a
// position's row lies in one slot whatever query reads it, so their windows
// are slices of one union range [first - W + 1, first + n - 1]. Only anchor
// queries read (first, last, and every W-th between: their windows cover
// the union; RingPool's StepReads), without outputs: each anchor's read tags
// say which positions it read live and which slots held another row, every
// other query's count is the lost positions in its window (O(W + n) per
// step instead of O(W * n)). The counterexample at S_min - 1 is replayed
// through the full reference runner (properties::run_scenario), which reads
// every query of the same RingPool.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "scenarios/scenario.hpp"
#include "sweep/formula.hpp"

namespace kvcheck::sweep {

/// Prefill order of one configuration.
enum class SweepOrder : std::uint8_t { kStoreThenLoad, kLoadThenStore };

/// "store-then-load" / "load-then-store" (the command-line spelling).
const char* order_flag_name(SweepOrder order) noexcept;
/// "store_then_load" / "load_then_store" (the scenario file spelling).
const char* order_file_name(SweepOrder order) noexcept;

/// One configuration of the grid.
struct SweepConfig {
  std::int64_t window_keys = 1;
  std::int64_t drafts = 0;
  std::int64_t chunk_rows = 1;
  SweepOrder order = SweepOrder::kStoreThenLoad;
  bool operator==(const SweepConfig&) const = default;
};

/// The grid: every combination, in row order window, drafts, chunk, order.
struct SweepGrid {
  std::vector<std::int64_t> windows;
  std::vector<std::int64_t> drafts;
  std::vector<std::int64_t> chunks;
  std::vector<SweepOrder> orders;
  std::int64_t size() const noexcept;
  SweepConfig at(std::int64_t row) const;
};

/// The default grid: W 64..4096 step 64, k 0..16, C 1, 16, 256, both orders.
SweepGrid default_grid();

/// Options of one probe (one configuration at one ring size).
struct ProbeOptions {
  std::int64_t states = 2;     ///< state blocks in the pool; steps of all states interleave
  bool all_phases = false;     ///< run every case at every ring phase 0..S-1 on one state (tests)
  std::string fault = "none";  ///< a named backend fault (tests: the checks must fire)
};

/// Slot collisions of one step, counted as properties::run_scenario counts them.
struct StepCollisions {
  std::int64_t same_step = 0;        ///< slots written twice by one step
  std::int64_t outside_block = 0;    ///< writes outside the request's block
  std::int64_t replaced_needed = 0;  ///< writes over a live row a query of the step reads
  std::int64_t total() const noexcept { return same_step + outside_block + replaced_needed; }
};

/// One step of a probe schedule.
struct ProbeStep {
  scenarios::StepKind kind = scenarios::StepKind::kDecode;
  std::int64_t rows = 0;                          ///< prefill rows
  SweepOrder order = SweepOrder::kLoadThenStore;  ///< prefill order
  std::int64_t drafts = 0;                        ///< verify k
  std::int64_t accepted = 0;                      ///< accept a
  bool operator==(const ProbeStep&) const = default;
};

/// What a probe found.
struct ProbeResult {
  bool safe = true;
  std::int64_t ring_rows = 0;
  std::int64_t steps_checked = 0;
  // When unsafe: the first failing step and the path that led to it from the
  // probe's history (e.g. verify(5); or verify(3), accept(0), decode).
  std::vector<ProbeStep> path;
  std::string hazard;                     ///< the path as text
  std::vector<std::int64_t> overwritten;  ///< per query of the failing step
  std::vector<std::int64_t>
      first_lost;  ///< positions lost by the first losing query, relative to its position (e.g. -127)
  StepCollisions collisions;
  /// Reads no visible position accounts for, plus windows of the wrong
  /// length and visible positions not read at all.
  std::int64_t extra_reads = 0;
  /// Live caches: the cache could not run this capacity (capabilities, or it
  /// refused the configuration at open): neither safe nor unsafe, a result
  /// of its own (the search treats it as not usable and goes on).
  bool refused = false;
  std::string refusal;  ///< why, when refused
};

/// Runs the worst-case schedules of `config` through a RingPool over the CPU
/// kernels with a ring of `ring_rows` rows; stops at the first step that
/// loses a row or collides.
ProbeResult probe_ring(const SweepConfig& config, std::int64_t ring_rows, const ProbeOptions& options);

/// Search statistics of one configuration.
struct SearchStats {
  std::int64_t probes = 0;
};

/// Smallest safe ring of `config`: galloping from `guess` (clamped to >= 1),
/// then binary search; relies on monotonicity in S (argument 7 above).
/// `below` receives the probe at S_min - 1 (unsafe), when S_min > 1.
std::int64_t find_min_safe_ring(const SweepConfig& config, std::int64_t guess, const ProbeOptions& options,
                                ProbeResult* below, SearchStats* stats);

/// The baseline: probe S = W, W + 1, ... until one is safe.
std::int64_t find_min_safe_ring_linear(const SweepConfig& config, const ProbeOptions& options,
                                       ProbeResult* below, SearchStats* stats);

/// History length of a probe at `phase` (the writes before the probed
/// steps): the window is full, the ring wrapped at least twice, and the first
/// probed row lands on slot `phase` (arguments 2, 3 above).
std::int64_t history_rows(std::int64_t window_keys, std::int64_t ring_rows, std::int64_t phase);

/// Step results of a schedule run through the probe's RingPool (for counterexamples).
struct ScheduleStepResult {
  std::vector<std::int64_t> overwritten;  ///< per query (empty for accept)
  StepCollisions collisions;
  std::int64_t extra_reads = 0;
};

/// Runs `steps` for one request on state 0 of a fresh one-state pool, from
/// length 0, with the same tag checks as probe_ring (no early stop).
std::vector<ScheduleStepResult> run_schedule(const SweepConfig& config, std::int64_t ring_rows,
                                             const std::vector<ProbeStep>& steps);

/// The counterexample at `ring_rows` (= S_min - 1): one request, load_then_store
/// prefill chunks filling the window, then the failing path of `below`, with
/// expectations (overwritten counts per losing step, total collisions) taken
/// from run_schedule. Returns nullopt if the path does not fail from there.
std::optional<scenarios::Scenario> make_counterexample(const SweepConfig& config, std::int64_t ring_rows,
                                                       const ProbeResult& below);

/// docs/semantics.md "Safe capacity" bound: max(W + k, W + C - 1) store-then-load, max(W + k, C) load-then-store.
std::int64_t spec_bound(const SweepConfig& config) noexcept;

// ---- paged caches -------------------------------------------------------------
// A cache that declares paged addressing (Capabilities::block_size B) is swept
// for the smallest pool, in blocks, that runs the worst-case schedule with no
// lost row and no refusal (a correct paged engine refuses a step it has no
// block for: "out-of-blocks"). Its probes run one live request at a time
// (worst_case_paged_scenario), so the minimum is per live request.
//
// What a request holds at once: a block is needed while any row in it may
// still be read, so a request holds the blocks of one run of consecutive
// positions, from the first position a later query can see to the last one
// written. Its longest such run is the ring bound's m = spec_bound(config):
// a store-then-load step of n rows (decode 1, verify k + 1, prefill C) holds
// the W - 1 positions before it and its own n, W - 1 + max(k + 1, C); a
// load-then-store prefill frees the old window's blocks as its rows pass
// them, holding max(W, C), and its verify W + k. m consecutive positions
// span at most ceil((m - 1) / B) + 1 blocks (the first at the last row of a
// block): paged_bound. The schedule runs every step at every phase mod B,
// so it meets that worst alignment.
//
// Declared slack (docs/semantics.md "Lookahead slots and deferred frees")
// lengthens the run: L lookahead slots past the step's last row add L; a
// free deferral of N steps lets the rows of the last N steps stay too, each
// step at most S = max(k + 1, C) rows, and lets rows wait through a step as
// a store-first cache's do, so m is W - 1 + S + N * S in either order. The
// paged schedule then also runs 2N + 2 steps of S rows in a row, a whole
// cycle of N + 1 of them between two frees at any phase of the cache's own.

/// Blocks one live request needs at once: ceil((m - 1) / B) + 1, m =
/// spec_bound(config) plus the slack `caps` declares (above).
std::int64_t paged_bound(const SweepConfig& config, std::int64_t block_size,
                         const engines::Capabilities& caps = {}) noexcept;
/// Blocks a cache needs that keeps each request's rows as a ring of m rows
/// laid over its blocks (slot p mod m, through the block table: `--impl
/// paged`), rewriting slots in place rather than freeing blocks the window
/// left: ceil(m / B), the least any cache holding m rows can have. It is
/// paged_bound or one block less; a paged row agrees when its minimum is
/// either.
std::int64_t paged_ring_bound(const SweepConfig& config, std::int64_t block_size) noexcept;
/// The pool `check` gives a paged cache per state (engines::paged_pool_blocks
/// at capacity m, with the slack `caps` declares): ceil((W - 1 + max(k + 1,
/// C) + slack) / B) + 1.
std::int64_t paged_default_pool(const SweepConfig& config, std::int64_t block_size,
                                const engines::Capabilities& caps = {}) noexcept;

/// The worst-case schedule of `config` for a paged cache of `block_size`
/// rows per block (capacity m = spec_bound(config), pool given at open by
/// the scenario's cache.pool_blocks): `states` requests one after another on one
/// state (the scenario declares one state: one live request), each
/// filling its window plus two blocks, then running the steps of
/// worst_case_scenario (decode, prefill(C), verify(k) with every accept(a)
/// followed by decode and prefill) once per phase of its first position mod
/// B assigned to it (phase r goes to request r mod states; decodes move the
/// request to the phase), and finishing, so the next request reuses the
/// blocks it freed. One request only when the cache has no finish.
scenarios::Scenario worst_case_paged_scenario(const SweepConfig& config, std::int64_t block_size,
                                              std::int64_t states, const engines::Capabilities& caps);
/// The seed engine's allocation W + max(0, k + 1).
std::int64_t seed_ring(const SweepConfig& config) noexcept;

/// When counterexample files are written.
enum class CounterexampleMode : std::uint8_t {
  kAuto,  ///< every row when the grid has at most kAutoCounterexampleRows rows, else none
  kAll,
  kNone,
};
/// Grids up to this many rows get counterexample files in kAuto mode.
inline constexpr std::int64_t kAutoCounterexampleRows = 64;
/// Counterexamples are replayed through properties::run_scenario up to this
/// window (the reference runner is O(W^3) on the fill).
inline constexpr std::int64_t kReplayWindowLimit = 512;

/// The worst-case schedule of `config` as a scenario at capacity `ring_rows`,
/// for caches kvcheck can only drive through the step-level interface
/// (`sweep --impl exec:...`). Its shape is one the cache declares
/// (sweep_shape): for a cache that reports its read slots the smallest
/// head_dim it accepts, one head; for one that reports none, rows wide
/// enough for the position code (properties/position_code.hpp) to give
/// every position a query can confuse (W + max(k + 1, C)) a class of its
/// own, up to 128 classes, and the `position-code` profile, so the outputs
/// tell which rows each query read. `states` requests on their own states, steps
/// interleaved; each fills its window (load_then_store chunks of at most
/// min(W, S) rows, or decodes when `lts_fill` is false) for two wraps, then
/// runs decode, prefill(C), and for every a in 0..k: verify(k), accept(a),
/// decode, verify(k), accept(a), prefill(C) (arguments 1-5 above); steps the
/// cache does not declare are left out.
scenarios::Scenario worst_case_scenario(const SweepConfig& config, std::int64_t ring_rows,
                                        std::int64_t states, const engines::Capabilities& caps);

/// The head shape (q_heads = kv_heads, head_dim) and value profile of the
/// worst-case scenario of `config` on a cache with `caps` (see above); the
/// cache's own checks (Capabilities::supports) decide what it accepts.
/// Falls back to one head of 2 when the cache declares nothing it accepts
/// (the runs then come back refused, each a result).
void sweep_shape(const SweepConfig& config, std::int64_t ring_rows, std::int64_t states,
                 const engines::Capabilities& caps, scenarios::Scenario* scenario);

/// Options of a sweep.
struct SweepOptions {
  /// Empty: the probes through RingPool over the CPU kernels. Otherwise a cache
  /// name for properties::make_provider ("layer", "exec:COMMAND", "cpu"):
  /// each candidate capacity is passed to the cache (the exec handshake's
  /// `capacity`) and worst_case_scenario() is run through the runner.
  std::string impl;
  double step_timeout_seconds = 10.0;  ///< exec adapters: seconds per answer
  ProbeOptions probe;
  int threads = 2;
  bool linear_search = false;      ///< use the baseline search (benchmarks)
  std::optional<Formula> formula;  ///< the user's rule, if any
  CounterexampleMode counterexamples = CounterexampleMode::kAuto;
  std::filesystem::path out_dir;  ///< where counterexample files go
  /// Called from the coordinating thread with rows finished so far.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
  /// Run only the shard `shard_index` of `shard_count` (`sweep --shard I/N`):
  /// the (drafts, chunk, order) columns u with u mod shard_count ==
  /// shard_index, each over all windows in window order, exactly as one
  /// process searches them (a column's search starts from its previous
  /// window's minimum, so probe counts depend on the column, never on the
  /// shard). Other rows keep only their configuration; see sweep_shard.hpp.
  std::int64_t shard_index = 0;
  std::int64_t shard_count = 1;
};

/// One row of the sweep.
struct SweepRow {
  SweepConfig config;
  std::int64_t min_safe_ring = 0;
  std::int64_t probes = 0;
  std::int64_t spec_bound = 0;
  bool spec_agrees = false;
  std::int64_t seed_ring = 0;
  // One row below the minimum (absent when S_min == 1).
  bool has_below = false;
  std::int64_t below_ring = 0;
  std::string below_hazard;
  std::vector<std::int64_t> below_overwritten;  ///< per query of the failing step
  std::vector<std::int64_t> below_first_lost;   ///< relative positions lost by the first losing query
  std::int64_t below_collisions = 0;
  std::string counterexample;  ///< file written, or empty
  bool replayed = false;       ///< replayed through properties::run_scenario
  bool replay_ok = true;       ///< the replay reproduced the expectations
  std::string replay_detail;   ///< first failure when not ok
  // The user's formula, when given.
  bool has_formula = false;
  std::int64_t formula_ring = 0;
  bool formula_safe = true;
  // Live caches: capacities the cache could not run (ProbeResult::refused).
  std::int64_t refused_capacities = 0;  ///< probes refused in this row's search
  std::string refusal;                  ///< the first refusal's reason, or empty
  /// True when the cache ran no capacity of this row at all (every probe
  /// refused): min_safe_ring is -1 and the row is "unsupported", not unsafe.
  bool unsupported = false;
};

/// Result of a sweep, rows in grid order.
struct SweepResult {
  SweepGrid grid;
  std::int64_t states = 2;
  std::vector<SweepRow> rows;
  std::optional<std::string> formula;  ///< the formula text
  std::int64_t formula_unsafe_rows = 0;
  std::int64_t spec_disagreements = 0;
  std::int64_t replay_failures = 0;
  std::int64_t no_safe_rows = 0;      ///< live caches: rows with no safe capacity (min_safe_ring -1)
  std::int64_t unsupported_rows = 0;  ///< live caches: rows whose every capacity was refused
  std::int64_t probes = 0;
  /// A paged cache was swept (its block size): every row's min_safe_ring,
  /// spec_bound (paged_bound), seed_ring (paged_default_pool) and formula
  /// value are pools in blocks. 0: rings, in rows.
  std::int64_t block_size = 0;
};

/// True when row `row` of `grid` belongs to shard `index` of `count`.
bool sweep_row_in_shard(const SweepGrid& grid, std::int64_t row, std::int64_t index,
                        std::int64_t count) noexcept;

/// Recomputes the result's totals (probes, disagreements, formula, replay,
/// no-safe rows) from its rows.
void summarize_sweep(SweepResult& result);

/// Runs the sweep on `options.threads` threads (results do not depend on
/// timing). Throws kvcheck::Error (kUsage for a formula that cannot be
/// evaluated, kIo for files).
SweepResult run_sweep(const SweepGrid& grid, const SweepOptions& options);

}  // namespace kvcheck::sweep
