// Randomized multi-request schedules (swarm testing). Each case draws, from
// its own seed, which step kinds are on and their weights (some zero), which
// of the features the cache declares it exercises (features.hpp: trims,
// shared prefixes of live and finished requests, a window per layer, long
// runs over a shared pool; each on in about half the cases, so every pair
// meets), a small cache configuration, and a schedule over one pool shared
// by several requests: prefill in both orders and any chunk size, decode,
// verify(k) with accept(a), finish and state reuse, reset, on one or more
// layers. Other requests often step between a verify and its accept, and a
// request may finish or reset with its drafts pending (docs/semantics.md
// "Steps": they are dropped). The ring is sized safely for the drawn bounds
// (docs/semantics.md "Safe capacity") plus a little random slack, so the
// correct implementation passes every case and each named fault fails some.
// Sizes keep a case to milliseconds at the reference's default precision.
//
// Each feature that shapes a schedule is one part of the generator (a
// FeaturePart in generator.cpp: its sizes, its configuration, the steps it
// places, what it adds after the schedule); a case composes the parts of
// the features it drew. A profile only sets sizes and emphasis.
//
// The production profile draws the shapes real caches run (windows up to
// 8192 in every convention, head_dim 64/128/256, up to 64 query heads in GQA
// groups up to 8, bf16/fp8/f32 rows, chunks up to 2048, verify up to 16
// drafts, up to four requests on up to four states) and spends a fixed work
// budget per case: a step that would exceed it is shortened, or ends the
// schedule, so a case costs about the same whatever its shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "properties/features.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// "default", "production", "trim", "paged", "layers" or "prefix".
std::string profile_name(Profile profile);
/// Parses a profile name; false when unknown.
bool parse_profile(const std::string& name, Profile* out);

/// Per-case work budget of the production profile (the reference's cost).
struct ProductionBudget {
  /// Reference multiply-adds: sum over queries of visible rows * q_heads * head_dim * layers.
  std::int64_t reference_macs = 0;
  /// Rows written times kv_heads * head_dim * layers (the reference keeps each row exactly).
  std::int64_t row_elements = 0;
  /// Pool bytes of the cache (layers * states * ring_rows * slot bytes).
  std::int64_t pool_bytes = 0;
};
/// The budget every production case is drawn under.
ProductionBudget production_budget();

/// Coverage classes a check run must reach (RC_CLASSIFY / CODE_PROBE style):
/// the schedule classes below, then one per feature (features.hpp: the
/// cases that exercised it), then one per pair of features (the cases that
/// exercised both).
struct Coverage {
  bool ring_wrap = false;                 ///< some write lands at position >= S (the ring wrapped)
  bool verify_rejection = false;          ///< an accept keeps fewer drafts than the verify wrote
  bool chunk_longer_than_window = false;  ///< a prefill chunk has more rows than the window
  bool state_reuse = false;               ///< a request starts on a state id another request freed
  // Production profile only:
  bool fast_cpu_kernel = false;  ///< the cache's own fast kernel runs (Capabilities::fast_kernel_runs)
  bool window_4096 = false;      ///< a query runs with a window of at least 4096 keys (index rows that wide)
  bool chunk_1024 = false;       ///< a prefill chunk of at least 1024 rows
  bool verify_8_drafts = false;  ///< a verify with at least 8 drafts
  bool position_100k = false;    ///< a row is written at a position of at least 10^5 (RoPE at long context)
  bool verify_then_other_request = false;  ///< another request steps between a verify and its accept
  bool finish_or_reset_with_drafts_pending = false;  ///< a finish or reset ends a pending verify's drafts
  // Trims:
  bool write_after_trim = false;               ///< a request writes again after a trim (positions rewritten)
  bool trim_with_drafts_pending = false;       ///< a trim drops a pending verify's drafts
  // Paged caches, from the run (classify_blocks):
  bool block_free = false;              ///< a whole block of a request left its window while it lived
  bool block_reuse_after_free = false;  ///< a block held one request's rows, then another request's
  bool verify_straddles_block = false;  ///< a verify's rows went to two or more blocks
  // A window per layer:
  bool sliding_and_global_layers = false;  ///< a case has a global layer and a sliding layer whose window slides
  bool sliding_windows_differ = false;     ///< two sliding layers with different windows, one of them sliding
  // Shared prefixes:
  bool prefix_of_live = false;               ///< a request begins from the prefix of an active request
  bool prefix_of_finished = false;           ///< a request begins from the prefix of a finished request
  bool cow_write_into_shared_block = false;  ///< a write lands in the block a shared prefix ends in
  bool window_free_of_shared_block = false;  ///< one sharer's window leaves a shared block the other still sees
  // Features met together:
  bool trim_into_prefix = false;  ///< a request that began from a shared prefix trims back into it
  // Pool pressure on a prefix cache, from the run (classify_cached):
  bool cached_block_evicted = false;  ///< a write took a slot whose row the cache had answered cached
  bool begin_from_evicted_prefix =
      false;  ///< a prefix begin's first query sees a source row cached, then evicted
  // Preemption (docs/semantics.md "Preemption"), from the run (classify_cached):
  bool preempt_then_resume = false;  ///< a preempted request resumed (its rows sent again at a begin)
  bool resume_with_prefix_hit =
      false;  ///< a resume the cache served a row of from one it still held or had cached
  // Recompute in a step (docs/semantics.md "Recompute in a step"), from the run (classify_cached):
  bool prefix_recomputed_in_step = false;  ///< a writing step stored prefix rows its begin left to it
  // One pool across layers (docs/semantics.md "One pool across layers"), from the run (classify_cached):
  bool slot_across_layers = false;  ///< a write took a slot another layer had released (freed or cached)
  /// The features the case exercised (exercised_features).
  FeatureSet features;
  // After all of the above: one per Capabilities::kernel_paths entry (the
  // cache's own dispatch, Capabilities::kernel_paths_run).
  std::vector<bool> kernel_paths;
};

/// What a coverage class counts.
enum class CoverageKind : std::uint8_t {
  kSchedule,  ///< a situation of the schedule or the run (ring_wrap, ...)
  kFeature,   ///< "feature:NAME": cases that exercised one feature
  kPair,      ///< "pair:A+B": cases that exercised both features
};

/// Feature classes are gated from this many cases on, pair classes from
/// kPairGateCases (fewer cases may miss a rare feature, or a rare pair, by
/// chance: a sink is drawn in one case in six, a shared row in one in
/// eight); they are counted and shown all the same.
inline constexpr std::int64_t kFeatureGateCases = 100;
inline constexpr std::int64_t kPairGateCases = 1000;

/// Names of every coverage class, in one fixed order for every profile: the
/// schedule classes in Coverage field order, then "feature:NAME" for each
/// row of KVCHECK_FEATURES, then "pair:A+B" for each pair of rows (A before
/// B in the table). Which of them a run gates: reachable_coverage.
const std::vector<std::string>& coverage_names();
/// The kind of each class, in coverage_names() order.
const std::vector<CoverageKind>& coverage_kinds();
/// From how many cases on each class is gated, in coverage_names() order:
/// 1 for the schedule classes every small check reaches, kFeatureGateCases
/// for a feature's class and for the schedule classes of a feature (trims,
/// blocks, layer windows, prefixes), kPairGateCases for a pair.
const std::vector<std::int64_t>& coverage_gate_cases();
/// coverage_names(), then the cache's own kernel paths
/// (Capabilities::kernel_paths), in that order: the classes a check of a
/// cache with `caps` counts (the same for every profile).
std::vector<std::string> coverage_names(const engines::Capabilities& caps);
/// The classes as booleans, in coverage_names() order, then c.kernel_paths
/// (classify sizes it to the cache's kernel_paths).
std::vector<bool> coverage_flags(const Coverage& c);
/// The class index of feature `f`, and of the pair (a, b) (a != b).
std::size_t feature_class(Feature f);
std::size_t pair_class(Feature a, Feature b);

/// Draws one scenario from `seed` (deterministic on every platform), using
/// only what `caps` supports. With every capability on (the default) the
/// default profile's draw is the same as it always was where the pending-verify
/// decisions (their own stream) do not fire, so most seeds keep their cases.
scenarios::Scenario generate_scenario(std::uint64_t seed, const engines::Capabilities& caps = {},
                                      Profile profile = Profile::kDefault);

/// Which coverage classes a cache with `caps` can reach under `profile`
/// (what the generator can draw for it): a class it cannot reach (ring wrap
/// for a cache without a sliding window, a fast kernel the cache does not
/// declare, a feature it does not declare, and every pair with one) is
/// shown, never gated.
std::vector<bool> reachable_coverage(const engines::Capabilities& caps, Profile profile = Profile::kDefault);

/// Which coverage classes a scenario reaches (computed from its schedule;
/// fast_cpu_kernel by the cache's own declaration, Capabilities::fast_kernel_runs).
Coverage classify(const scenarios::Scenario& scenario, const engines::Capabilities& caps = {});

struct RunObservation;

/// Block frees and reuses of one run of a paged cache (layer 0).
struct BlockCounts {
  /// Blocks a cache that frees by the window frees (from the schedule and
  /// the block size): blocks of a request every row of which is below the
  /// first position its next query sees...
  std::int64_t window_frees = 0;
  /// ...and the blocks a request holds when it finishes or resets.
  std::int64_t end_frees = 0;
  /// Writes into a block that last held other rows (another request's, or
  /// another block of positions of the same request, or rows from before a
  /// reset), from the slots the cache reported: slot / block_size.
  std::int64_t reuses = 0;
};

/// The paged profile's classes of one run of a cache with `block_size` > 0
/// (else nothing): block_free from the schedule, block_reuse_after_free and
/// verify_straddles_block from the written slots the cache reported (by
/// positions when it reports none). Adds them to `cov` and returns the counts.
BlockCounts classify_blocks(const scenarios::Scenario& scenario, const RunObservation& run,
                            std::int64_t block_size, Coverage* cov);

/// The pool-pressure classes of one run (docs/semantics.md "Cached rows"),
/// from what the shadow map saw on layer 0: cached_block_evicted (a write
/// over a cached row) and begin_from_evicted_prefix (a prefix begin whose
/// first query sees a source row that was cached and is gone), and the
/// preemption classes preempt_then_resume and resume_with_prefix_hit,
/// prefix_recomputed_in_step, and slot_across_layers (a pool shared by the
/// layers). Adds them to `cov`.
void classify_cached(const RunObservation& run, Coverage* cov);

}  // namespace kvcheck::properties
