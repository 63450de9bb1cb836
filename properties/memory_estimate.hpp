// Memory a run will take, estimated before anything is allocated, and the
// refusal of a run that would not fit. A scenario's cache, its schedule and
// the reference's bookkeeping each cost a known amount per row, per slot and
// per read (measured on the CPU backend at 113 bits: README "Memory"), so a
// ring of 2^28 rows or 10^5 layers is refused in milliseconds with the
// estimate and the field that drives it, instead of running out of memory
// after minutes. Estimates are upper bounds in practice, not exact counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "properties/generator.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// An estimate of peak resident bytes, with the term that dominates it.
struct MemoryEstimate {
  double bytes = 0;         ///< estimated peak resident bytes
  double driver_bytes = 0;  ///< the largest term's bytes
  std::string driver;       ///< the field that drives the largest term, e.g. "cache.ring_rows"
  std::string
      driver_formula;  ///< what the largest term counts, e.g. "layers*states*ring_rows*(slot+tag bytes)"
};

/// Estimate of one run of `scenario` (cache pool, per-layer buffers, the
/// reference's rows, and the observations kept for the report).
MemoryEstimate estimate_run(const scenarios::Scenario& scenario, const RunOptions& options);

/// Estimate of replaying `scenarios` one after the other: the largest run's
/// transient memory plus every run's observations (all kept for the report).
MemoryEstimate estimate_replay(const std::vector<scenarios::Scenario>& scenarios, const RunOptions& options);

/// Estimate of `kvcheck check`: `threads` workers, each at the profile's
/// largest case. Independent of the case count: results are streamed.
MemoryEstimate estimate_check(Profile profile, int threads);

/// Bytes this process may still use: the smaller of MemAvailable
/// (/proc/meminfo) and the cgroup v2 limit less its usage; `source` names
/// where the number came from. A huge value when neither can be read.
std::int64_t available_memory_bytes(std::string* source);

/// Parses `--memory-limit`: bytes, or a number with K, M, G or T (powers of 1024).
std::int64_t parse_memory_limit(const std::string& flag, const std::string& text);

/// Throws kvcheck::Error(kMemory) at the estimate's driving field, one line
/// with the estimate and the limit, when `estimate` exceeds `limit_bytes`.
void require_memory(const MemoryEstimate& estimate, std::int64_t limit_bytes,
                    const std::string& limit_source);

/// "25.8 GB" style text of a byte count (decimal units).
std::string bytes_text(double bytes);

}  // namespace kvcheck::properties
