// `kvcheck check`: many generated cases on both cores, coverage gates, and a
// shrunk counterexample for the first failure. The cases are split by index
// between worker threads and their results merged in case order, so the
// outcome (and every report) depends only on the seed, never on timing.
//
// A run can also be split over processes (`--shard I/N`, MPI ranks): each
// runs the cases whose index is I mod N with run_cases() and returns a
// CaseTally (counts and its lowest failing index, no shrinking); the tallies
// are added with merge_tallies() and finish_check() shrinks the lowest
// failing case of the whole run once. run_check() is exactly
// finish_check(run_cases()) on one shard, so both give the same result.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "properties/agreement.hpp"
#include "properties/generator.hpp"
#include "properties/observation.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// The cases one process runs: those whose index is `index` modulo `count`.
/// Striding (not contiguous ranges) keeps every shard's mix of cases the
/// same whatever the case count, and a shard's cases are still known from
/// (index, count) alone.
struct Shard {
  std::int64_t index = 0;  ///< 0 .. count - 1
  std::int64_t count = 1;  ///< shards of the whole run
};

/// Options of one check run.
struct CheckOptions {
  std::int64_t cases = 200;  ///< cases of the whole run (every shard's)
  std::uint64_t seed = 1;
  Profile profile = Profile::kDefault;  ///< which distribution cases are drawn from (--profile)
  RunOptions run;
  int threads = 2;
  Shard shard;  ///< run_cases() runs this shard's cases only
  /// The check fails when fewer than this share of its cases ran (the rest
  /// refused by the cache or outside its capabilities): `--min-run-share`.
  double min_run_share = 0.8;
  /// Makes the cache providers instead of make_provider(run) when set: one
  /// for the coordinating thread (capabilities, shrinking) and one per
  /// worker, so a C++ engine's caches are never shared between threads.
  /// Workers call it from their own threads, possibly at the same time.
  /// `run.provider` is ignored by run_check either way.
  std::function<std::unique_ptr<engines::CacheProvider>()> provider_factory;
  /// With `run.against` set: makes the second cache's providers, as
  /// provider_factory the first's (else make_provider(second_run(run))).
  /// With --repeat-bitwise the first cache's provider serves both runs.
  std::function<std::unique_ptr<engines::CacheProvider>()> against_provider_factory;
  /// Called from the coordinating thread with cases finished so far.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
  /// Called from the coordinating thread, after the cases, with what the
  /// check is doing ("shrinking case seed 42: 17 runs"), at every run, and
  /// with "" when it is done.
  std::function<void(const std::string& what)> activity;
  /// `--case-seed X`: every case is the one case seed X draws (a check of it
  /// runs `cases` = 1), whatever `seed`: one generated case run again.
  std::optional<std::uint64_t> only_case_seed;
  /// `--no-coverage-gate` false: a coverage class no case reached does not
  /// fail the check (a small run meant as such); the counts are still shown.
  bool coverage_gate = true;
  /// `--max-failures N`: once N cases have failed, no further case is
  /// drawn; the check counts the cases up to and including its N-th lowest
  /// failing case, and no other (the same cases whatever the threads: cases
  /// after it that were already running are dropped). 0: every case runs.
  std::int64_t max_failures = 0;
};

/// Result of a check run.
struct CheckResult {
  std::int64_t cases = 0;
  std::int64_t failures = 0;
  std::vector<std::int64_t> coverage_counts;    ///< per coverage_names() entry
  std::vector<bool> reachable;                  ///< per entry: whether the generator can draw it for the cache
  /// Per entry: the cases drawn with the class that the cache refused at
  /// open or that fell outside its declared space (not counted above).
  std::vector<std::int64_t> coverage_refused;
  /// Per entry: the gate, cases the check needs (0: not gated). A reachable
  /// class is gated at 1, a pair of features only from kPairGateCases cases
  /// on; one that no case ran, and that the cache refused whenever it was
  /// drawn, is not gated (coverage_refused says why).
  std::vector<std::int64_t> coverage_minimums;
  bool coverage_ok = true;                      ///< every gated class reached its minimum
  /// Names of the last classes: the cache's Capabilities::kernel_paths
  /// (coverage_names(caps) is coverage_names() and these).
  std::vector<std::string> kernel_paths;
  /// A paged cache (Capabilities::block_size > 0): its block size, and the
  /// block frees and reuses summed over the cases that ran (BlockCounts).
  std::int64_t block_size = 0;
  std::int64_t block_window_frees = 0;
  std::int64_t block_end_frees = 0;
  std::int64_t block_reuses = 0;
  std::int64_t skipped = 0;                     ///< cases outside the cache's capabilities (not sent)
  std::int64_t refused = 0;                     ///< cases the cache refused at open
  std::int64_t queries = 0;                     ///< queries of the cases that ran
  std::int64_t queries_not_output_checked = 0;  ///< of those, queries whose output was not judged
  bool run_share_ok = true;                     ///< ran() >= min_run_share * cases
  // Two caches side by side (run.against, run.repeat_bitwise): what was
  // compared over every case (a PASS compared this much), and the shrunk
  // difference's comparison and second run.
  ComparedCounts compared;            ///< summed over every case
  PairComparison difference;          ///< the shrunk case's comparison (side by side, on failure)
  RunObservation shrunk_run_b;        ///< the second cache's run of the shrunk case
  /// Cases that ran: neither refused nor skipped.
  std::int64_t ran() const noexcept { return cases - skipped - refused; }
  bool found_failure = false;
  std::uint64_t failing_case_seed = 0;  ///< seed of the first failing case
  /// Seeds of the failing cases in case order, the first kListedFailingCases
  /// of them (`failures` counts them all).
  std::vector<std::uint64_t> failing_case_seeds;
  std::string observed;  ///< CaseTally::observed
  scenarios::Scenario original;         ///< the first failing case as drawn
  scenarios::Scenario shrunk;           ///< its shrunk counterexample
  RunObservation shrunk_run;            ///< observation of the shrunk case
  std::int64_t shrink_runs = 0;         ///< scenarios run while shrinking
  /// Whether the failing case fails again alone in a fresh cache (a new
  /// provider: a new adapter process for exec, new caches otherwise), as
  /// every reported counterexample is replayed before it is reported. When
  /// false the failure depends on earlier cases (the engine keeps state
  /// across close/open, or is not deterministic): `shrunk` is the case as
  /// drawn (not shrunk), `earlier_cases` what ran before it.
  bool reproduces_alone = true;
  /// When the failure does not reproduce alone: the cases that ran before it
  /// in its process, oldest first (the shortest kept tail that, run first in
  /// a fresh cache, makes it fail again; every kept one when none does).
  std::vector<std::uint64_t> earlier_case_seeds;
  std::vector<scenarios::Scenario> earlier_cases;  ///< those cases' schedules, in the same order
  bool reproduces_after_earlier = false;  ///< whether running earlier_cases first reproduced the failure
  std::int64_t earlier_cases_run = 0;     ///< cases that ran before it in its process in all
  std::string first_failure_there;        ///< its first failure as it happened in that process
  /// Cases whose cache crashed once but passed when run again alone in a
  /// fresh cache: not failures (a failure is reported only if it happens
  /// again), counted and said.
  std::int64_t crashes_not_reproduced = 0;
  /// With --max-failures: the cases after the check stopped (not drawn, or
  /// dropped), not among `cases`; 0 when it did not stop early.
  std::int64_t cases_not_run = 0;
};

/// How many failing cases a check lists (the lowest indices): report.json's
/// failing_case_seeds, with the count of all of them beside it.
inline constexpr std::size_t kListedFailingCases = 1000;

/// How many of the cases that ran before the lowest failing case in its
/// process a check keeps (the last ones), to reproduce a failure that does
/// not fail alone.
inline constexpr std::size_t kKeptEarlierCases = 256;

/// How many of the lowest failing cases a check may shrink: the first, and
/// when its counterexample is still larger than kSmallCounterexampleSteps
/// steps or kSmallCounterexampleRequests requests, the next ones, keeping the
/// smallest (a greedy shrink can stop at a local minimum another failing
/// case does not have).
inline constexpr std::size_t kShrunkFailingCases = 4;
inline constexpr std::size_t kSmallCounterexampleSteps = 8;
inline constexpr std::size_t kSmallCounterexampleRequests = 3;

/// What the cases of one shard (or of a whole run) found, before shrinking.
struct CaseTally {
  std::int64_t cases = 0;                       ///< cases run
  /// With --max-failures: the shard's cases after the check stopped (not
  /// among `cases`). Kept in memory only (a shard never stops early).
  std::int64_t cases_not_run = 0;
  std::int64_t failures = 0;                    ///< cases that failed
  std::int64_t skipped = 0;                     ///< cases outside the cache's capabilities (not sent)
  std::int64_t refused = 0;                     ///< cases the cache refused at open
  std::int64_t queries = 0;                     ///< queries of the cases that ran
  std::int64_t queries_not_output_checked = 0;  ///< of those, queries whose output was not judged
  std::vector<std::int64_t> coverage_counts;    ///< per coverage_names() entry
  std::vector<bool> reachable;                  ///< per entry: whether the cache can reach it
  std::vector<std::int64_t> coverage_refused;   ///< per entry: cases drawn with it, refused or skipped
  /// The cache's Capabilities::kernel_paths, the last classes' names. Kept in memory only.
  std::vector<std::string> kernel_paths;
  std::int64_t block_size = 0;                  ///< the cache's Capabilities::block_size (0: not paged)
  std::int64_t block_window_frees = 0;          ///< paged caches: BlockCounts summed over the cases that ran
  std::int64_t block_end_frees = 0;
  std::int64_t block_reuses = 0;
  std::int64_t first_failing_case = -1;         ///< lowest failing case index, -1 when none
  /// The lowest failing case indices, ascending (at most kShrunkFailingCases,
  /// first_failing_case first). Kept in memory only (not in a shard document).
  std::vector<std::int64_t> lowest_failing_cases;
  /// Every failing case index, ascending: the lowest kListedFailingCases of
  /// them (`failures` counts them all).
  std::vector<std::int64_t> failing_cases;
  /// What the cache makes available (properties::observed_name of the
  /// check's capabilities); empty in a tally read from an older shard document.
  std::string observed;
  /// The case indices that ran before first_failing_case in the same cache
  /// provider (one worker's adapter process), oldest first: the last
  /// kKeptEarlierCases of them. Kept in memory only (not in a shard document).
  std::vector<std::int64_t> earlier_cases;
  std::int64_t earlier_cases_run = 0;  ///< how many ran before it there in all
  std::string first_failure;           ///< the failing case's first failure there
  /// Cases whose cache crashed, then passed run again alone in a fresh cache
  /// (not failures). Kept in memory only (not in a shard document).
  std::int64_t crashes_not_reproduced = 0;
  // Side by side only (kept in memory only, not in a shard document).
  ComparedCounts compared;
  bool operator==(const CaseTally&) const = default;
};

/// `text` quoted for a POSIX shell when it needs it.
std::string shell_quote(const std::string& text);
// replay_arguments(): properties/option_table.hpp.

/// Seed of case `index` of a check run with `seed`.
std::uint64_t case_seed(std::uint64_t seed, std::int64_t index);

/// Seed of case `index` of the check `options` describes: its only case
/// seed when it has one (`--case-seed`), else case_seed(options.seed, index).
std::uint64_t check_case_seed(const CheckOptions& options, std::int64_t index);

/// Runs the cases; on failure shrinks the first failing case (lowest index).
/// Ignores `options.shard` (runs every case).
CheckResult run_check(const CheckOptions& options);

/// Runs the cases of `options.shard` only (index = shard.index mod
/// shard.count, over 0 .. options.cases - 1) and tallies them; no shrinking.
CaseTally run_cases(const CheckOptions& options);

/// The tally of a whole run from the tallies of its shards: counts added, the
/// lowest failing index kept. `reachable` (and the number of classes) must be equal in every tally
/// (KVCHECK_ASSERT: the caller checks the shards agree first).
CaseTally merge_tallies(const std::vector<CaseTally>& shards);

/// The result of the whole run from its tally: coverage gates and, when a
/// case failed, the lowest failing case regenerated from its seed and shrunk
/// (the cache provider is made only then).
CheckResult finish_check(const CheckOptions& options, const CaseTally& tally);

/// Whether case `case_index` of the run `options` describes fails when it
/// runs alone in a fresh cache (a new provider from options.provider_factory
/// or options.run): `merge` re-runs a shard's failing case with it.
bool case_fails_alone(const CheckOptions& options, std::int64_t case_index);

/// Greedy shrinking: repeatedly tries smaller variants (fewer requests,
/// fewer steps, shorter chunks, fewer drafts; fewer features: no shared
/// prefix, no trim, a decode for a verify, no window per layer or one
/// layer fewer; one layer, half the layers or one fewer, dropped from the
/// end, or any one layer, with their windows and explicit rows; fewer
/// heads, narrower heads,
/// f64 rows, no RoPE, no sink) and keeps any that still fails, until none
/// does. `fails` must be deterministic.
scenarios::Scenario shrink_scenario(const scenarios::Scenario& failing,
                                    const std::function<bool(const scenarios::Scenario&)>& fails,
                                    std::int64_t* runs);

}  // namespace kvcheck::properties
