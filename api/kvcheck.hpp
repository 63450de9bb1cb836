// kvcheck as a library: the randomized check and scenario replay of the
// `kvcheck` executable, run in-process on a cache a C++ engine implements,
// from the engine's own test suite.
//
//   find_package(kvcheck CONFIG REQUIRED)
//   target_link_libraries(my_test PRIVATE kvcheck::kvcheck)
//
//   #include "api/kvcheck.hpp"
//   kvcheck::api::CheckOptions options;
//   options.cases = 300;
//   const auto result = kvcheck::api::check([] { return std::make_unique<MyProvider>(); }, options);
//   REQUIRE(result.passed);   // else result.counterexample is the shrunk schedule
//
// The whole package (CMakeLists of api/) installs the headers below
// <prefix>/include/kvcheck with their folder layout ("engines/...",
// "properties/..."), so every kvcheck header is reachable the same way.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "properties/agreement.hpp"
#include "properties/observation.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::api {

/// How an engine plugs its cache in: implement two classes of
/// engines/cache_under_test.hpp.
///
/// * `engines::CacheProvider` makes caches of one kind.
///   - `capabilities()` declares what the cache runs (`engines::Capabilities`:
///     step kinds and prefill orders, element formats, RoPE styles, GQA,
///     shared rows, sink, limits, whether it reports slots, refusal probes).
///     The generator draws only that; replay skips (never passes) a scenario
///     the cache cannot run.
///   - `open(spec, &refusal)` returns a fresh cache for one run of
///     `spec` (`engines::CacheSpec`: states, `cache.ring_rows` rows of
///     capacity per state, `window_keys` keys per query, layers, heads,
///     format, RoPE, resolved softmax scale, sink, most rows per step), or
///     nullptr with the refusal filled in (the run is then skipped).
///   - `name()` names it in reports.
/// * `engines::CacheUnderTest` is one cache for one run, all layers.
///   `call(call, &answer)` gets a begin (`StepCall::Op::kBegin`: bind
///   `call.step.request` to `call.state` on `call.layer`) or a step
///   (`call.step.kind`: prefill in `call.step.order`, decode, verify with
///   `call.step.drafts`, accept with `call.step.accepted`, finish, reset) at
///   `call.position` with `call.rows` rows of keys, values (nullptr for
///   shared rows) and queries, all before RoPE. For prefill, decode and
///   verify the answer must contain:
///   - `out`: `rows * q_heads * head_dim` attention outputs (row major);
///   - when the cache can tell (declare it in the capabilities):
///     `written` (the slot of each new row, `has_written = true`) and
///     `read_offsets`/`read_slots` (the slots each query read,
///     `has_reads = true`), slots being any integers that identify storage;
///   - `view`: `ReadView::kAfterWrites` when the step stored all its rows
///     before its queries read, `ReadView::kCausal` when each query saw the
///     step's rows up to itself and the pool as it was before the step.
///   A call the cache refuses returns an `engines::Refusal` (its own code
///   and detail) and must leave the cache exactly as it was; `fingerprint`
///   (optional) lets kvcheck check that.
///
/// kvcheck computes the reference in high precision, tracks every slot the
/// cache reported in a shadow map, and judges lost, missing and extra rows,
/// collisions and output differences per query.
using ProviderFactory = std::function<std::unique_ptr<engines::CacheProvider>()>;

/// Options of a randomized check.
struct CheckOptions {
  std::int64_t cases = 200;  ///< generated schedules
  std::uint64_t seed = 1;    ///< same seed, same cases, same result
  int threads = 2;           ///< worker threads (each with its own provider)
  bool probes = true;        ///< send the refusal probes the capabilities list
  int precision_bits = 113;  ///< reference significand bits: 53, 113 or 169
  /// When not empty and a case fails, the shrunk counterexample is written
  /// here as a scenario file (format version 1; replay it with `replay` or
  /// `kvcheck replay FILE`). Parent directories are created.
  std::filesystem::path counterexample_path;
  /// Called from the calling thread with cases finished so far.
  std::function<void(std::int64_t done, std::int64_t total)> progress;
  /// Two caches side by side (`kvcheck check --against`): when set, every
  /// case also runs on a cache of this second provider (one per worker plus
  /// one for the calling thread, like `factory`'s), drawn inside what both
  /// caches declare, and the check fails at every step where what the two
  /// hold (resident rows), read or output (beyond the larger of their
  /// tolerances) differs; the first differing case is shrunk like a failure.
  /// E.g. the CPU and CUDA backends of one engine, or two versions of it.
  ProviderFactory against;
  /// With `against`: outputs must be equal bit for bit (`--bitwise`).
  bool bitwise = false;
  /// Every case runs twice, on fresh caches of `factory`'s provider, and the
  /// two runs must agree with bitwise-equal outputs (`--repeat-bitwise`; its
  /// own property). Not with `against`.
  bool repeat_bitwise = false;
};

/// One coverage class of the generated cases.
struct Coverage {
  std::string name;        ///< "ring_wrap", "feature:trim", "pair:trim+prefix", ...
  std::int64_t count = 0;  ///< cases that hit it
  bool reachable = true;   ///< whether the generator can draw it for the cache's capabilities
  std::int64_t minimum = 0;  ///< the gate: cases the check needs (0: not gated)
};

/// The outcome of a randomized check.
struct CheckResult {
  bool passed = false;       ///< no case failed and every reachable coverage class was hit
  std::string cache;         ///< the provider's name()
  std::uint64_t seed = 0;    ///< CheckOptions::seed
  int precision_bits = 113;  ///< CheckOptions::precision_bits
  std::int64_t cases = 0;
  std::int64_t failures = 0;  ///< failing cases
  std::int64_t skipped = 0;   ///< cases the cache refused to open
  bool coverage_ok = true;
  std::vector<Coverage> coverage;
  bool found_failure = false;
  std::uint64_t failing_case_seed = 0;            ///< seed of the first failing case
  scenarios::Scenario original;                   ///< that case as generated
  scenarios::Scenario counterexample;             ///< shrunk from it (fewest requests, steps, rows)
  properties::RunObservation counterexample_run;  ///< what kvcheck observed replaying it
  std::int64_t shrink_runs = 0;                   ///< scenarios run while shrinking
  std::filesystem::path counterexample_file;      ///< where it was written, empty when not
  // Two caches side by side (CheckOptions::against or repeat_bitwise):
  std::string against;  ///< the second provider's name() ("" when none; repeat_bitwise: `cache` again)
  bool bitwise = false;         ///< CheckOptions::bitwise
  bool repeat_bitwise = false;  ///< CheckOptions::repeat_bitwise
  properties::ComparedCounts compared;  ///< what was compared over every case (steps, queries, ...)
  /// The shrunk case's differing steps (`what`: "resident", "reads",
  /// "outputs", "refusal", "stopped"), in step order; empty when all agreed.
  std::vector<properties::StepDifference> differences;
  properties::RunObservation counterexample_run_against;  ///< the second cache's run of it
};

/// Runs `options.cases` generated schedules on caches from `factory`, on
/// `options.threads` threads: one provider per worker plus one for the
/// calling thread, which reads the capabilities and shrinks the first
/// failing case. The factory is called from worker threads. An exception
/// a cache throws from `call` or `open` (other than a kvcheck::Error or
/// std::bad_alloc) is a failing case, shrunk like any other, with what it
/// threw as its first failure (`counterexample_run.first_failure`), if the
/// case fails again alone in a fresh cache. Throws kvcheck::Error when a
/// provider throws one (a broken provider, not a failed property).
CheckResult check(const ProviderFactory& factory, const CheckOptions& options = {});

/// The same on one provider the caller owns: the cases run on one thread
/// (`options.threads` is ignored), since a provider need not be thread-safe.
CheckResult check(engines::CacheProvider& provider, const CheckOptions& options = {});

/// Options of a replay.
struct ReplayOptions {
  bool probes = true;
  int precision_bits = 113;
};

/// Replays scenario files (format version 1) on caches of `provider`, in the
/// order of scenarios::collect_scenario_files (a directory contributes every
/// `*.json` below it). Every file is loaded first: a bad file throws
/// kvcheck::Error before anything runs. A scenario the cache cannot run
/// comes back `skipped` with the reason; `passed` is false when a property
/// failed or an expectation of the file was not met.
std::vector<properties::RunObservation> replay(engines::CacheProvider& provider,
                                               const std::vector<std::filesystem::path>& files_or_dirs,
                                               const ReplayOptions& options = {});

/// True when every run passed and none was skipped.
bool all_passed(const std::vector<properties::RunObservation>& runs) noexcept;

/// The text report of `kvcheck check` / `kvcheck replay`: a line per run and
/// an explanation of each failure (for test-failure messages). The replay
/// form names the reference precision the runs used in its header.
std::string summary(const CheckResult& result);
std::string summary(const std::vector<properties::RunObservation>& runs, int precision_bits = 113);

}  // namespace kvcheck::api
