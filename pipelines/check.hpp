// The check pipeline behind `kvcheck check` and `kvcheck merge` (and the
// parts `replay`, `audit` and `demo` share): run the randomized check, print
// its summary, write the report set with the shrunk counterexample, write or
// merge the shard documents of a split run, record a run for `audit`.
// cli/ reads the flags into properties::CheckOptions and calls these;
// nothing here reads a flag.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "properties/check.hpp"
#include "properties/runner.hpp"
#include "reports/output_set.hpp"
#include "reports/report.hpp"
#include "pipelines/shard.hpp"
#include "scenarios/scenario.hpp"
#include "scenarios/trace_json.hpp"

namespace kvcheck::pipelines {

/// The context every report of a run records: seed, cache, fault name,
/// `command` (the command line as reports record it), and the reference's
/// precision: `precision_requested` as --precision names it (53, 113, 169)
/// and precision_bits, the real significand bits the runs record (53, 114,
/// 168; reference_significand_bits).
reports::ReportContext report_context(const std::string& command, std::uint64_t seed,
                                      const std::string& backend, const std::string& fault, int precision_requested);

/// Writes `files` as one set (reports/output_set.hpp) and returns `code`.
/// When writing fails the verdict stays visible: the error line goes to
/// stderr, and a failed property still exits 1 (2 only when everything
/// passed but its files could not be written). No file of the set, and none
/// of an earlier run's at the same paths, is left behind.
int write_set_keeping_verdict(const std::vector<reports::OutputFile>& files, int code);

/// The report files `replay` and `audit` are asked for by name (--text,
/// --report, --junit, --html); absent ones are not written.
struct ReportFiles {
  std::optional<std::filesystem::path> text;   ///< the text report (`text`, as printed)
  std::optional<std::filesystem::path> json;   ///< report.json's format
  std::optional<std::filesystem::path> junit;  ///< JUnit XML
  std::optional<std::filesystem::path> html;   ///< the HTML report
};

/// Writes the files of `report` that `files` names, as one set, in the order
/// text, JSON, JUnit, HTML (`text` is the report's text as printed), then
/// `extra` (a --record trace); returns 0 when every run passed, else 1 (see
/// write_set_keeping_verdict).
int write_report_files(const reports::Report& report, const std::string& text, const ReportFiles& files,
                       std::vector<reports::OutputFile> extra = {});

/// The report set of `report` in `dir`: the counterexample (if any), the
/// four reports and `extra` (a --record trace), written together or not at
/// all; returns `code` (see write_set_keeping_verdict).
int write_reports(const reports::Report& report, const std::filesystem::path& dir, int code,
                  std::vector<reports::OutputFile> extra = {});

/// The outputs `files` names, for reports::require_distinct_outputs.
std::vector<reports::NamedOutput> named_outputs(const ReportFiles& files);

/// The four reports `write_reports` writes into `dir`, named "--out", for
/// reports::require_distinct_outputs.
std::vector<reports::NamedOutput> report_set_outputs(const std::filesystem::path& dir);

/// Runs `scenarios` through a recording wrapper around the cache `options`
/// names, appending every run to `trace` (the `--record` format, read back by
/// `kvcheck audit`).
std::vector<properties::RunObservation> record_runs(const std::vector<scenarios::Scenario>& scenarios_in,
                                                    properties::RunOptions options,
                                                    const std::shared_ptr<scenarios::TraceWriter>& trace);

/// Records the run a check's `--record` asks for into `trace`: the
/// counterexample when a case failed (read back from its file), else case 0.
void record_check_run(const properties::CheckOptions& options, const reports::Report& report,
                      const std::shared_ptr<scenarios::TraceWriter>& trace);

/// Runs the check with these options, prints its summary, and fills `report`
/// (the shrunk counterexample as an attachment for `out_dir`); returns the
/// exit code (1 for a failed property or an unreached coverage class).
int run_check_into(const properties::CheckOptions& options, const std::filesystem::path& out_dir,
                   reports::Report& report);

/// Makes sure `dir` exists and takes files, before any work is done (a bad
/// --out is one line and exit 2 up front, not after every case has run),
/// and withdraws an earlier run's report set there (report_set_files): a
/// run that ends without a verdict leaves no earlier verdict standing, and
/// a passing run no earlier counterexample.
void prepare_out_dir(const std::filesystem::path& dir);

/// The files of a report set in `dir` as they are now: the four reports
/// (whether they exist or not) and every counterexample-*.json there.
std::vector<std::filesystem::path> report_set_files(const std::filesystem::path& dir);

/// Withdraws the report files `files` names, and the --record trace when
/// given (replay, audit), before a run, as prepare_out_dir does for --out.
void withdraw_report_files(const ReportFiles& files,
                           const std::optional<std::filesystem::path>& record = std::nullopt);

/// The whole check in one process (`kvcheck check` without --shard): the
/// check run, its summary printed, the recorded run (the counterexample when
/// a case failed, else case 0) traced in memory, and the report set written
/// into `out_dir` with the trace at `record` as one set (a write failure
/// keeps a FAIL verdict's exit 1). cli/ checks `record` before any work.
/// Returns the exit code.
int run_check(const properties::CheckOptions& options, const std::string& command,
              const std::filesystem::path& out_dir, const std::optional<std::string>& record);

/// One shard of a split check (`options.shard`): its cases only, no
/// shrinking, no report; writes `out_dir`/shard.json and prints one line.
/// Returns 0 once the shard is written.
int run_check_shard(const properties::CheckOptions& options, const std::string& command,
                    const std::filesystem::path& out_dir);

/// This process's shard of a check, as a shard document (`command` is the
/// command line as reports record it).
std::string check_shard_text(const properties::CheckOptions& options, const std::string& command,
                             const properties::CaseTally& tally);

/// The options a check shard records (pipelines::check_options_from_json),
/// as the check's options: the inverse of what check_shard_text writes.
/// Throws kvcheck::Error(kShard) naming the shard and field.
properties::CheckOptions check_options_of(const pipelines::ShardResult& shard);

/// The report of a whole check from its shards (already ordered by
/// pipelines::order_shards): the tallies added, the lowest failing case shrunk
/// once here, the report written to `out_dir`. `workers` names what ran the
/// shards; a merge that ran no case itself (`ran_cases` false) prints its
/// own time from `start`. Returns the exit code.
///
/// Nothing a shard document says is run: `engine` is the cache from the
/// merge's own command line (--impl; MPI rank 0 passes its own), which must
/// equal the shards' recorded engine, and is required when a shard reports a
/// failing case. Each such case is re-run alone in a fresh cache of `engine`
/// and a shard whose failure does not reproduce is refused; so are tallies
/// no run can have (counts out of range or overflowing when added, coverage
/// classes the cache cannot or can reach recorded otherwise). Every refusal
/// is kvcheck::Error(kShard) naming the shard and field, thrown before
/// `out_dir` is touched.
int merge_check(const std::vector<pipelines::ShardResult>& shards, const std::filesystem::path& out_dir,
                const std::string& workers, std::chrono::steady_clock::time_point start, bool ran_cases,
                const std::optional<std::string>& engine);

/// Seconds since `start` (printed, never written into a report).
double seconds_since(std::chrono::steady_clock::time_point start);

}  // namespace kvcheck::pipelines
