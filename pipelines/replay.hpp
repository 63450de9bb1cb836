// The replay pipeline behind `kvcheck replay`: the scenario files loaded
// (every one before any run), the runs on the cache the options name (through
// a recording wrapper for --record), the report printed and its files
// written as one set. cli/ reads the flags into a ReplayRequest; nothing
// here reads a flag.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipelines/check.hpp"
#include "properties/memory_estimate.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::pipelines {

/// What `kvcheck replay` was asked for, its scenarios aside.
struct ReplayRequest {
  properties::RunOptions run;                   ///< the cache, fault, precision, reference and step timeout
  std::string command;                          ///< the command line as reports record it
  std::optional<std::filesystem::path> record;  ///< --record: the trace every run is appended to
  ReportFiles files;                            ///< --report, --junit, --html (no --text)
  std::optional<std::int64_t> work_limit;       ///< --work-limit: most reads; none: no bound
  /// Draws progress (reads judged, reads estimated) for long work; may be empty.
  std::function<void(std::int64_t, std::int64_t)> progress;
  /// Where the announcement of long work goes ("kvcheck replay: about ..."); stderr when null.
  std::FILE* notes = stderr;
};

/// A counter for RunOptions::on_query_judged that draws `progress` (done,
/// total) at most ten times a second and once more at the end, and says on
/// `notes` what `what` ("replay") will do before work over
/// properties::kLongWorkReads reads; empty when there is nothing to show.
std::function<void(std::int64_t)> long_work_meter(
    const std::string& what, double reads, double all_layer_reads, const properties::MemoryEstimate& memory,
    const std::function<void(std::int64_t, std::int64_t)>& progress, std::FILE* notes);

/// The scenarios of `files_or_dirs` (files, or directories of *.json), each
/// named after its file when it has no name. Every file is read and checked
/// here, before anything runs or is written; throws kvcheck::Error for a bad
/// file and when there is no scenario file at all.
std::vector<scenarios::Scenario> load_replay_scenarios(const std::vector<std::string>& files_or_dirs);

/// Replays `loaded`: refused up front when the estimated memory exceeds
/// `memory_limit_bytes` (`limit_source` says where the limit came from) or
/// the estimated reads exceed `request.work_limit`; long work is announced
/// and shown with `request.progress`; the
/// report printed to stdout and its files written, with the --record trace,
/// as one set (cli/ checks the paths before any run). Returns 0 when every
/// run passed, else 1 (see write_set_keeping_verdict).
int run_replay(const std::vector<scenarios::Scenario>& loaded, const ReplayRequest& request,
               std::int64_t memory_limit_bytes, const std::string& limit_source);

}  // namespace kvcheck::pipelines
