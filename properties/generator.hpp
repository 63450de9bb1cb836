// Randomized multi-request schedules (swarm testing). Each case draws, from
// its own seed, which step kinds are on and their weights (some zero), a
// small cache configuration, and a schedule over one pool shared by several
// requests: prefill in both orders and any chunk size, decode, verify(k) with
// accept(a), finish and state reuse, reset, on one or two layers. Other
// requests often step between a verify and its accept, and a request may
// finish or reset with its drafts pending (SPEC §3: they are dropped). The ring is
// sized safely for the drawn bounds (SPEC §5) plus a little random slack, so
// the correct implementation passes every case and each named fault fails
// some. Sizes keep a case to milliseconds at the reference's default precision.
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
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// Which distribution `kvcheck check` draws cases from (`--profile`).
enum class Profile : std::uint8_t {
  kDefault,     ///< small caches (window 1..7, head width 2..8): milliseconds a case
  kProduction,  ///< production shapes under a per-case work budget
  /// The default profile's cases plus trims (from their own stream) for a
  /// cache that declares trim, its ring grown by the trim depth drawn.
  kTrim,
  /// Cases that cross many block boundaries, for paged pools (its own
  /// stream): windows of one to three blocks, 4..8 requests long and short
  /// on 2..4 states, so windows free blocks, requests finish and reset and
  /// their blocks go to others, and verifies straddle blocks. The block size
  /// is the cache's (Capabilities::block_size), else 4.
  kPaged,
  /// The default profile's cases with a window per layer (2..4 layers,
  /// sliding and global ones mixed, from their own stream) for a cache that
  /// declares per_layer_windows; other caches get the default's cases.
  kLayers,
  /// The default profile's cases with shared prefixes (from their own
  /// stream: up to 4 requests on at least two states, a request often
  /// beginning from another's prefix) for a cache that declares
  /// prefix_sharing; other caches get cases without prefixes.
  kPrefix,
};

/// "default", "production", "trim", "layers" or "prefix".
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

/// Coverage classes a check run must reach (RC_CLASSIFY / CODE_PROBE style).
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
  // Both profiles (listed after the production profile's own five there):
  bool verify_then_other_request = false;  ///< another request steps between a verify and its accept
  bool finish_or_reset_with_drafts_pending = false;  ///< a finish or reset ends a pending verify's drafts
  // Trim profile only (last):
  bool write_after_trim = false;               ///< a request writes again after a trim (positions rewritten)
  bool trim_with_drafts_pending = false;       ///< a trim drops a pending verify's drafts
  // Paged profile only, from the run (classify_blocks):
  bool block_free = false;              ///< a whole block of a request left its window while it lived
  bool block_reuse_after_free = false;  ///< a block held one request's rows, then another request's
  bool verify_straddles_block = false;  ///< a verify's rows went to two or more blocks
  // Layers profile only (last):
  bool sliding_and_global_layers = false;  ///< a case has a global layer and a sliding layer whose window slides
  bool sliding_windows_differ = false;     ///< two sliding layers with different windows, one of them sliding
  // Prefix profile only (last):
  bool prefix_of_live = false;               ///< a request begins from the prefix of an active request
  bool prefix_of_finished = false;           ///< a request begins from the prefix of a finished request
  bool cow_write_into_shared_block = false;  ///< a write lands in the block a shared prefix ends in
  bool window_free_of_shared_block = false;  ///< one sharer's window leaves a shared block the other still sees
  // Every profile, after all of the above: one per Capabilities::kernel_paths
  // entry (the cache's own dispatch, Capabilities::kernel_paths_run).
  std::vector<bool> kernel_paths;
};

/// Names of the coverage classes of `profile`, in Coverage field order: the
/// default's first four, then (production only) five of the production
/// profile's own, then the two schedule classes both profiles have, then
/// (trim only) the trim profile's two. A class
/// keeps its index when classes are added: new ones go last.
std::vector<std::string> coverage_names(Profile profile = Profile::kDefault);
/// coverage_names(profile), then the cache's own kernel paths
/// (Capabilities::kernel_paths), in that order: the classes a check of a
/// cache with `caps` counts.
std::vector<std::string> coverage_names(Profile profile, const engines::Capabilities& caps);
/// The classes of `profile` as booleans, in coverage_names(profile) order,
/// then c.kernel_paths (classify sizes it to the cache's kernel_paths).
std::vector<bool> coverage_flags(const Coverage& c, Profile profile = Profile::kDefault);

/// Draws one scenario from `seed` (deterministic on every platform), using
/// only what `caps` supports. With every capability on (the default) the
/// default profile's draw is the same as it always was where the pending-verify
/// decisions (their own stream) do not fire, so most seeds keep their cases.
scenarios::Scenario generate_scenario(std::uint64_t seed, const engines::Capabilities& caps = {},
                                      Profile profile = Profile::kDefault);

/// Which coverage classes of `profile` a cache with `caps` can reach at all
/// (a class it cannot reach, e.g. ring wrap for a cache without a sliding
/// window, or a fast kernel the cache does not declare, is not gated).
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

}  // namespace kvcheck::properties
