// Runs one scenario on the reference model and on an implementation, step by
// step, and observes per query what SPEC §4 lists: expected rows, rows read
// with the tag each held at read time, overwritten visible rows, missing and
// extra reads, slot collisions of the three kinds, and the output difference
// against the high-precision reference (kernel error on the dequantized rows,
// quantization error on the exact rows).
//
// This is one of the two places (with cli/ and tests/) where the model and an
// implementation meet; the translation between their types happens here.
#pragma once

#include <cstdint>
#include <string>

#include "impl/kv_cache.hpp"
#include "properties/observation.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// How to run a scenario.
struct RunOptions {
  std::string backend = "cpu";        ///< make_backend name
  impl::Fault fault = impl::Fault::kNone;
  bool record_reads = true;           ///< keep every read in QueryObservation::reads
  bool record_ring = true;            ///< keep StepObservation::ring_positions (S <= 512)
  bool check_outputs = true;          ///< false: tags only (faster; used by sweeps)
  int precision_bits = 113;           ///< reference significand bits: 53, 113 (default) or 169
};

/// Visible keys per query of a cache configuration (window convention applied).
std::int64_t window_keys(const scenarios::CacheConfig& cache);

/// The backend PoolSpec of a scenario (max_step_rows from its steps).
impl::PoolSpec pool_spec(const scenarios::Scenario& scenario, impl::Fault fault);

/// Runs `scenario`. Throws kvcheck::Error for a configuration the backend
/// refuses (kSize, kDevice, ...); a refusal in the middle of a schedule is an
/// observation (the run fails), not an exception.
RunObservation run_scenario(const scenarios::Scenario& scenario, const RunOptions& options);

}  // namespace kvcheck::properties
