// Runs one scenario on the reference model and on an implementation, step by
// step, and observes per query what docs/semantics.md "What is judged" lists: expected rows, rows read
// with the tag each held at read time, overwritten visible rows, missing and
// extra reads, slot collisions of the three kinds, and the output difference
// against the high-precision reference (kernel error on the dequantized rows,
// quantization error on the exact rows).
//
// The implementation is any cache under test behind the step-level interface
// (engines/cache_under_test.hpp): every observation comes from what the cache
// reported, through the shadow map of properties/shadow.hpp. This is one of
// the places (with cli/ and tests/) where the model and an implementation
// meet; the translation between their types happens here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engines/cache_under_test.hpp"
#include "engines/exec_hello.hpp"
#include "properties/observation.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// How the high-precision reference is computed (precision 113 and 169).
enum class Reference : std::uint8_t {
  kCertified,  ///< double-double with a bound; MPFR only where the bound does not pin a figure (model/certified.hpp)
  kMpfr,  ///< MPFR for every query
};

/// How to run a scenario.
struct RunOptions {
  /// The cache: "cpu", "cuda" (ring pool over that kernel table), "layer"
  /// (the layer-bound cache) or "exec:COMMAND" (engines/exec_cache.hpp).
  std::string backend = "cpu";
  /// The provider to open caches from; when null one is made from `backend`
  /// and `fault` for this run (an exec adapter is then started per run).
  engines::CacheProvider* provider = nullptr;
  /// Send refusal probes along the schedule: one call per step the cache
  /// must refuse, leaving its fingerprint unchanged (Capabilities::probes).
  bool probes = true;
  double step_timeout_seconds = 10.0;  ///< exec adapters: seconds per answer
  /// exec adapters: what hello offers (binary frames, or JSON only); the
  /// same verdicts and report bytes either way.
  engines::ExecEncoding exec_encoding = engines::ExecEncoding::kJson;
  /// A named fault of the cache (`kvcheck faults`; "none": as written). The
  /// checker carries it by name: the provider that makes the cache resolves
  /// it (engines/factory.hpp), the reports print it as given.
  std::string fault = "none";
  bool record_reads = true;                     ///< keep every read in QueryObservation::reads
  bool record_ring = true;                      ///< keep StepObservation::ring_positions (S <= 512)
  bool record_outputs = false;                  ///< keep each query's output in QueryObservation::out
  bool record_resident = false;                 ///< keep StepObservation::resident after every step
  bool check_outputs = true;                    ///< false: tags only (faster; used by sweeps)
  /// `--against IMPL`: the second cache a check or replay runs every case on
  /// beside this one, compared step by step (properties/agreement.hpp); ""
  /// when none. run_scenario itself runs one cache and ignores it.
  std::string against;
  /// `--repeat-bitwise`: every case runs twice, on fresh caches of this one
  /// provider, and the two runs must give bitwise-equal outputs.
  bool repeat_bitwise = false;
  /// `--bitwise`: with --against, outputs must be equal bit for bit (not only
  /// within the larger of the two caches' tolerances).
  bool bitwise = false;
  int precision_bits = 113;                     ///< reference significand bits: 53, 113 (default) or 169
  Reference reference = Reference::kCertified;  ///< at 113 and 169 bits; same figures either way
  /// Called after each query's output is judged with the rows it could see
  /// (position - visible_first + 1): the work the reference did, for a
  /// progress line over a long replay or audit. Empty: not called.
  std::function<void(std::int64_t reads)> on_query_judged;
};

/// Visible keys per query of a cache configuration (window convention applied).
std::int64_t window_keys(const scenarios::CacheConfig& cache);

/// The cache spec of a scenario (window keys and scale resolved, max_step_rows from its steps).
engines::CacheSpec cache_spec(const scenarios::Scenario& scenario);

/// Which observations a cache with `caps` makes available, as reports name
/// them (RunObservation::observed): "slots+outputs", "written-slots+outputs",
/// "outputs", or "slots" for a bookkeeping-only cache (it reports slots and
/// no outputs; kvcheck computes the outputs over the rows its slots name).
std::string observed_name(const engines::Capabilities& caps);

/// Makes the provider named by `options.backend` (with `options.fault`).
std::unique_ptr<engines::CacheProvider> make_provider(const RunOptions& options);

/// Runs `scenario`. A scenario the cache cannot run (capabilities, or the
/// cache refused the configuration at open) comes back `skipped` with the
/// reason. Throws kvcheck::Error for a broken provider (kDevice, kAdapter);
/// a refusal in the middle of a schedule is an observation (the run fails),
/// not an exception.
RunObservation run_scenario(const scenarios::Scenario& scenario, const RunOptions& options);

/// The real significand bits of the reference `--precision` names: 53
/// (double), 113 (model::Real, 34 decimal digits: Boost gives
/// mpfr_float_backend<34> 34 * 1000 / 301 + 2 = 114 bits) or 169
/// (model::Real50: 168 bits). What every run records as precision_bits, and
/// so what a report's context records; other values are returned as given.
int reference_significand_bits(int precision_requested);

}  // namespace kvcheck::properties
