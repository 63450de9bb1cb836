// Memory a run will take, estimated before anything is allocated, and the
// refusal of a run that would not fit. A scenario's cache, its schedule and
// the reference's bookkeeping each cost a known amount per row, per slot and
// per read (measured on the CPU backend at 113 bits: README "Memory"), so a
// ring of 2^28 rows or 10^5 layers is refused in milliseconds with the
// estimate and the field that drives it, instead of running out of memory
// after minutes. Estimates are upper bounds in practice, not exact counts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "properties/generator.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario.hpp"
#include "scenarios/trace.hpp"

namespace kvcheck::properties {

/// An estimate of peak resident bytes, with the term that dominates it.
struct MemoryEstimate {
  double bytes = 0;         ///< estimated peak resident bytes
  double driver_bytes = 0;  ///< the largest term's bytes
  std::string driver;       ///< the field that drives the largest term, e.g. "cache.ring_rows"
  std::string
      driver_formula;  ///< what the largest term counts, e.g. "layers*states*ring_rows*(slot+tag bytes)"
};

/// Whether kvcheck allocates the cache's pool for `backend`: its own caches
/// (cpu, cuda, paged, layer) yes; an exec adapter or a trace holds its slots
/// itself, so only each step's rows and answers are charged for them.
bool backend_owns_pool(const std::string& backend);

/// Estimate of one run of `scenario` (cache pool, per-layer buffers, the
/// reference's rows, and the observations kept for the report).
MemoryEstimate estimate_run(const scenarios::Scenario& scenario, const RunOptions& options);

/// Estimate of replaying `scenarios` one after the other: the largest run's
/// transient memory plus every run's observations (all kept for the report).
MemoryEstimate estimate_replay(const std::vector<scenarios::Scenario>& scenarios, const RunOptions& options);

/// Estimate of `kvcheck audit`: the replay estimate of the traces' scenarios
/// (options.backend "trace": no pool) plus every recorded read, expanded.
MemoryEstimate estimate_audit(const std::vector<scenarios::Scenario>& scenarios,
                              const std::vector<scenarios::TraceRun>& runs, const RunOptions& options);

/// The sizes of a capacity sweep's grid that its memory grows with.
struct SweepSize {
  double configurations = 0;  ///< windows * drafts * chunks * orders
  double max_window = 0, max_drafts = 0, max_chunk = 0;
  double states = 1;
  int threads = 1;
  std::string widest_flag = "--window";  ///< the grid flag with the most values
};

/// Estimate of `kvcheck sweep` (or merging a sweep's shards): one result row
/// per configuration plus each worker's probe.
MemoryEstimate estimate_sweep(const SweepSize& size);

/// Rows a sweep's probes simulate, at most: configurations times the
/// longest probe (window + longest step) times kSweepProbesPerConfiguration
/// (the galloping search's probes per configuration, generously).
inline constexpr double kSweepProbesPerConfiguration = 8;

/// The probe rows a sweep of `size` simulates, at most.
double sweep_probe_rows(const SweepSize& size);

/// Throws kvcheck::Error(kSize) at the grid's widest flag when the sweep's
/// probes would simulate more than `limit` rows (--work-limit; none: no
/// bound, the grid runs however long it takes, with its progress line).
void require_sweep_work(const SweepSize& size, std::optional<std::int64_t> limit);

/// Work past which a command says up front what it will do (its estimated
/// reads and memory, on stderr) and shows its progress on a terminal: 2^22
/// reads, about 30 s of the reference at 113 bits (a 2048-row prefill over a
/// 2048-row window, 2.1 M reads, takes 15 s). Nothing is refused for its
/// work unless the user sets --work-limit.
inline constexpr double kLongWorkReads = double(std::int64_t{1} << 22);

/// The reads a run will do, with the field of the step that reads the most.
struct WorkEstimate {
  double reads = 0;                  ///< every query's visible rows in one layer, all runs
  double all_layer_reads = 0;        ///< the same over every layer (what a progress line counts)
  std::string driver;                ///< e.g. "steps[0].rows", or "line 2: block_table.seq_lens" for a trace
  std::string driver_scenario;       ///< the scenario or trace file of that step
  double recorded_reads = 0;         ///< traces: the reads all their records list (block tables expanded)
  double layer0_recorded_reads = 0;  ///< the same, of layer 0's records only (the work bound's share)
  std::string recorded_driver, recorded_source;
};

/// Reads of replaying `scenarios`.
WorkEstimate estimate_replay_work(const std::vector<scenarios::Scenario>& scenarios);

/// Reads of auditing `runs` (their scenarios `scenarios`): the larger of the
/// schedule's visible rows and the reads the records list.
WorkEstimate estimate_audit_work(const std::vector<scenarios::Scenario>& scenarios,
                                 const std::vector<scenarios::TraceRun>& runs);

/// Throws kvcheck::Error(kSize) at the driving field when `work` reads more
/// than `limit` rows (--work-limit; none: never); `what` names the command
/// ("the replay").
void require_work(const WorkEstimate& work, const std::string& what, std::optional<std::int64_t> limit);

/// The reads of `cases` cases of `profile` in `kvcheck check`: the cases
/// times the profile's mean reads per case (measured over its first 1000
/// case seeds on the CPU cache, rounded up), an estimate, not a bound.
double estimate_check_reads(Profile profile, std::int64_t cases);

/// Throws kvcheck::Error(kSize) at --cases when `estimate_check_reads`
/// exceeds `limit` (--work-limit; none: never).
void require_check_work(Profile profile, std::int64_t cases, std::optional<std::int64_t> limit);

/// Parses `--work-limit`: rows, or a whole number with K, M, G or T (powers of 1024).
std::int64_t parse_work_limit(const std::string& flag, const std::string& text);

/// "4.19e+06 reads, estimated peak memory 1.2 GB": the one line a command
/// prints before work over kLongWorkReads.
std::string work_text(double reads, const MemoryEstimate& memory);

/// Estimate of `kvcheck check`: `threads` workers, each at the profile's
/// largest case. Independent of the case count: results are streamed.
MemoryEstimate estimate_check(Profile profile, int threads);

/// Bytes this process may still use: the smallest of MemAvailable
/// (/proc/meminfo), the cgroup v2 limit less its usage and the address-space
/// limit (RLIMIT_AS, `ulimit -v`) less what the process has mapped; `source` names
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
