// Recorded traces as caches under test, and recording any cache to a trace.
//
// The trace provider answers each call from the record of a trace run
// (scenarios/trace.hpp) with the same step index and layer: the slots the
// engine wrote and read (block tables expanded), its outputs when recorded,
// its refusals. `kvcheck audit` (properties/audit.hpp) runs a scenario built
// from the same trace against it, so a trace is judged by the very runner and
// shadow map that judge live caches.
//
// The recording provider wraps any provider and writes, for each run, a
// header built from the cache spec and one record per call with what the
// wrapped cache answered (explicit slot lists, the read view, the rows sent
// and the outputs), so auditing the recording gives the live run's verdict.
// Refused calls are recorded with `"refused":"code: detail"`. Refusal probes
// (calls invalid under docs/semantics.md "Steps" step semantics, or rows with NaN, which the
// runner sends in `check` and a correct cache refuses) are not recorded: a
// trace holds the schedule only.
#pragma once

#include <memory>
#include <string>

#include "engines/cache_under_test.hpp"
#include "scenarios/trace.hpp"
#include "scenarios/trace_json.hpp"

namespace kvcheck::engines {

/// A provider whose caches replay `run` (copied). Capabilities: every step
/// kind, format and layout; ring_addressing when the header says "ring";
/// written and read slots reported; the header's declarations (shared_pool,
/// lookahead_slots, free_deferral_steps with frees reported, output_format,
/// resident_bound) as the recorded cache's own; slots in the pool when the
/// header gives pool_blocks. A call that disagrees with its record
/// (kind, request, state, position, rows) or has no record throws
/// kvcheck::Error naming the trace line.
std::unique_ptr<CacheProvider> make_trace_provider(const scenarios::TraceRun& run);

/// A provider that records every run of the provider it wraps.
class RecordingProvider : public CacheProvider {
 public:
  /// The name written in the header of the runs opened from now on (e.g. the
  /// scenario's name before each replay). Until it is called, the first run
  /// gets the name given to make_recording_provider, later runs "NAME#2", ...
  virtual void set_run_name(std::string name) = 0;
  /// set_run_name(scenario.name), and the scenario's expectations go into the
  /// header too, so that auditing the recording judges the run as replay
  /// did (a scenario that expects lost rows passes both ways). Call it before
  /// each run_scenario.
  virtual void set_scenario(const scenarios::Scenario& scenario) = 0;
};

/// Wraps `inner`: each run is appended to `writer` as one piece when its
/// cache is closed (destroyed), so runs from several threads never
/// interleave. Throws kvcheck::Error(kUsage, "--record") when `inner` does not
/// report both written and read slots (a trace needs them).
std::unique_ptr<RecordingProvider> make_recording_provider(std::unique_ptr<CacheProvider> inner,
                                                           std::shared_ptr<scenarios::TraceWriter> writer,
                                                           std::string name);

}  // namespace kvcheck::engines
