#include "pipelines/check.hpp"

#include <unistd.h>

#include <cstdio>
#include <system_error>

#include "engines/factory.hpp"
#include "engines/trace_cache.hpp"
#include "impl/kv_cache.hpp"
#include "pipelines/catalog.hpp"
#include "properties/generator.hpp"
#include "properties/runner.hpp"
#include "reports/report_html.hpp"
#include "reports/report_json.hpp"
#include "reports/report_junit.hpp"
#include "reports/report_text.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/atomic_write.hpp"
#include "support/error.hpp"

namespace kvcheck::pipelines {

namespace fs = std::filesystem;

namespace {

/// Prints the summary and fills `report` (the counterexample as an
/// attachment) from a finished check; returns the exit code. Shared by one process, the merge
/// of shards and MPI rank 0, so all three print and write the same.
int report_check(const properties::CheckOptions& options, const properties::CheckResult& result,
                 const std::string& timing, const fs::path& out_dir, reports::Report& report) {
  reports::CheckSummary summary;
  summary.cases = result.cases;
  summary.failures = result.failures;
  const auto names = properties::coverage_names(options.profile);
  for (std::size_t i = 0; i < names.size(); ++i) {
    // A class the cache cannot reach (e.g. ring wrap without a window) is shown, not gated.
    summary.coverage.push_back({names[i], result.coverage_counts[i], result.reachable[i] ? 1 : 0});
  }
  summary.failing_case_seed = result.failing_case_seed;
  if (result.found_failure) {
    // Written with the reports, as one set (write_reports); the directory
    // is made now, as a failure to make it shows as the set's write error.
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    const fs::path file = out_dir / (result.shrunk.name + ".json");
    report.attachments.push_back({file, scenarios::save_scenario(result.shrunk)});
    summary.counterexample_file = file.string();
    summary.replay_command = "kvcheck replay " + properties::shell_quote(file.string()) + " " +
                             properties::replay_arguments(options.run);
    report.runs.push_back(result.shrunk_run);
  }
  report.check = summary;
  std::printf("check: %lld cases, %lld failing, seed %llu, backend %s, fault %s%s\n",
              static_cast<long long>(result.cases), static_cast<long long>(result.failures),
              static_cast<unsigned long long>(options.seed), options.run.backend.c_str(),
              std::string(impl::fault_name(options.run.fault)).c_str(),
              options.profile == properties::Profile::kDefault
                  ? ""
                  : (", profile " + properties::profile_name(options.profile)).c_str());
  if (result.skipped > 0) {
    std::printf("skipped: %lld cases the cache refused to open\n", static_cast<long long>(result.skipped));
  }
  std::printf("coverage:");
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::printf(" %s=%lld%s", names[i].c_str(), static_cast<long long>(result.coverage_counts[i]),
                result.reachable[i] ? "" : "(n/a)");
  }
  std::printf("%s\n", result.coverage_ok ? "" : "  (a class was never reached: FAIL)");
  if (result.found_failure) {
    std::printf(
        "counterexample: %zu requests, %zu steps (shrunk from %zu steps in %lld runs), case seed %llu\n",
        result.shrunk.requests.size(), result.shrunk.steps.size(), result.original.steps.size(),
        static_cast<long long>(result.shrink_runs),
        static_cast<unsigned long long>(result.failing_case_seed));
    std::printf("  first failure: %s\n", result.shrunk_run.first_failure.c_str());
    std::printf("  written to %s\n  replay: %s\n", summary.counterexample_file.c_str(),
                summary.replay_command.c_str());
  }
  std::printf("time: %s\n", timing.c_str());
  return result.found_failure || !result.coverage_ok ? 1 : 0;
}

/// "0.41 s, 725 cases/s on 2 threads", or "0.02 s merging 3 shards" when
/// `cases` < 0: printed, never written into a report.
std::string timing_text(std::int64_t cases, double seconds, const std::string& workers) {
  char text[160];
  if (cases < 0) {
    std::snprintf(text, sizeof text, "%.2f s %s", seconds, workers.c_str());
  } else {
    std::snprintf(text, sizeof text, "%.2f s, %.0f cases/s on %s", seconds,
                  seconds > 0 ? static_cast<double>(cases) / seconds : 0.0, workers.c_str());
  }
  return text;
}

/// The options every shard of one check must share.
reports::CheckShardOptions shard_options(const properties::CheckOptions& options,
                                         const std::string& command) {
  reports::CheckShardOptions o;
  o.impl = options.run.backend;
  o.fault = std::string(impl::fault_name(options.run.fault));
  o.cases = options.cases;
  o.seed = options.seed;
  o.precision_requested = options.run.precision_bits;
  o.step_timeout_seconds = options.run.step_timeout_seconds;
  o.command = command;
  o.profile = properties::profile_name(options.profile);
  return o;
}

}  // namespace

reports::ReportContext report_context(const std::string& command, std::uint64_t seed,
                                      const std::string& backend, impl::Fault fault,
                                      int precision_requested) {
  reports::ReportContext ctx;
  ctx.precision_bits = properties::reference_significand_bits(precision_requested);
  ctx.precision_requested = precision_requested;
  ctx.seed = seed;
  ctx.backend = backend;
  ctx.fault = std::string(impl::fault_name(fault));
  ctx.command = command;
  return ctx;
}

int write_set_keeping_verdict(const std::vector<reports::OutputFile>& files, int code) {
  try {
    reports::write_output_set(files);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fprintf(stderr, "kvcheck: the verdict (%s) stands; its files were not written\n",
                 code == 1   ? "FAIL"
                 : code == 0 ? "PASS"
                             : "error");
    return code == 1 ? 1 : 2;
  }
  return code;
}

int write_report_files(const reports::Report& report, const std::string& text, const ReportFiles& files) {
  std::vector<reports::OutputFile> outputs;
  if (files.text) outputs.push_back({*files.text, text});
  if (files.json) outputs.push_back({*files.json, reports::report_json_text(report)});
  if (files.junit) outputs.push_back({*files.junit, reports::report_junit(report)});
  if (files.html) outputs.push_back({*files.html, reports::report_html(report)});
  return write_set_keeping_verdict(outputs, report.passed() ? 0 : 1);
}

int write_reports(const reports::Report& report, const fs::path& dir, int code) {
  std::error_code ec;
  fs::create_directories(dir, ec);  // a failure shows as the set's write error
  std::vector<reports::OutputFile> files = report.attachments;
  files.push_back({dir / "report.json", reports::report_json_text(report)});
  files.push_back({dir / "report.txt", reports::report_text(report)});
  files.push_back({dir / "report.html", reports::report_html(report)});
  files.push_back({dir / "junit.xml", reports::report_junit(report)});
  return write_set_keeping_verdict(files, code);
}

std::vector<properties::RunObservation> record_runs(const std::vector<scenarios::Scenario>& scenarios_in,
                                                    properties::RunOptions options,
                                                    const std::shared_ptr<scenarios::TraceWriter>& trace) {
  auto recorder = engines::make_recording_provider(properties::make_provider(options), trace, "kvcheck");
  options.provider = recorder.get();
  std::vector<properties::RunObservation> runs;
  for (const auto& sc : scenarios_in) {
    recorder->set_scenario(sc);
    runs.push_back(properties::run_scenario(sc, options));
  }
  trace->check();
  return runs;
}

void record_check_run(const properties::CheckOptions& options, const reports::Report& report,
                      const std::shared_ptr<scenarios::TraceWriter>& trace) {
  const scenarios::Scenario sc =
      report.check && !report.check->counterexample_file.empty()
          ? scenarios::load_scenario_file(report.check->counterexample_file)
          : properties::generate_scenario(properties::case_seed(options.seed, 0),
                                          properties::make_provider(options.run)->capabilities(),
                                          options.profile);
  record_runs({sc}, options.run, trace);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run_check_into(const properties::CheckOptions& options, const fs::path& out_dir,
                   reports::Report& report) {
  const auto start = std::chrono::steady_clock::now();
  const properties::CheckResult result = properties::run_check(options);
  return report_check(
      options, result,
      timing_text(result.cases, seconds_since(start), std::to_string(options.threads) + " threads"), out_dir,
      report);
}

std::string check_shard_text(const properties::CheckOptions& options, const std::string& command,
                             const properties::CaseTally& tally) {
  return reports::shard_text(
      "check", reports::ReportContext{}.tool_version, options.shard.index, options.shard.count,
      reports::check_options_json(shard_options(options, command)), reports::tally_json(tally));
}

void prepare_out_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw Error(ErrorId::kIo, "--out",
                "cannot create directory '" + dir.string() +
                    "': " + (ec ? ec.message() : std::string("a file is in the way")));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error(ErrorId::kIo, "--out", "directory '" + dir.string() + "' is not writable");
  }
}

int run_check(const properties::CheckOptions& options, const std::string& command, const fs::path& out_dir,
              const std::optional<std::string>& record) {
  reports::Report report;
  report.context = report_context(command, options.seed, options.run.backend, options.run.fault,
                                  options.run.precision_bits);
  // The trace file is opened (and truncated) before any work: a bad path is exit 2 up front.
  std::shared_ptr<scenarios::TraceWriter> trace;
  if (record) trace = std::make_shared<scenarios::TraceWriter>(fs::path(*record));
  const int checked = run_check_into(options, out_dir, report);
  const int code = write_reports(report, out_dir, checked);
  if (code != checked) return code;
  std::printf("reports: %s/report.{json,txt,html}, %s/junit.xml\n", out_dir.string().c_str(),
              out_dir.string().c_str());
  if (trace) {
    // The counterexample when a case failed, else case 0: one run a reader can audit.
    record_check_run(options, report, trace);
    std::printf("trace: %s\n", record->c_str());
  }
  return code;
}

int run_check_shard(const properties::CheckOptions& options, const std::string& command,
                    const fs::path& out_dir) {
  const auto start = std::chrono::steady_clock::now();
  const properties::CaseTally tally = properties::run_cases(options);
  const fs::path file = out_dir / reports::kShardFileName;
  write_file_atomic(file, check_shard_text(options, command, tally));
  std::printf("check shard %lld/%lld: %lld of %lld cases, %lld failing",
              static_cast<long long>(options.shard.index), static_cast<long long>(options.shard.count),
              static_cast<long long>(tally.cases), static_cast<long long>(options.cases),
              static_cast<long long>(tally.failures));
  if (tally.first_failing_case >= 0)
    std::printf(" (lowest case %lld)", static_cast<long long>(tally.first_failing_case));
  std::printf(", %.2f s on %d threads\nshard: %s (join the shards with kvcheck merge)\n",
              seconds_since(start), options.threads, file.string().c_str());
  return 0;
}

int merge_check(const std::vector<reports::ShardResult>& shards, const fs::path& out_dir,
                const std::string& workers, std::chrono::steady_clock::time_point start, bool ran_cases) {
  const reports::CheckShardOptions o = reports::check_options_from_json(shards.front());
  properties::CheckOptions options;
  options.cases = o.cases;
  options.seed = o.seed;
  options.run.backend = o.impl;
  options.run.precision_bits = o.precision_requested;
  options.run.step_timeout_seconds = o.step_timeout_seconds;
  if (!impl::parse_fault(o.fault, &options.run.fault)) {
    throw Error(ErrorId::kJsonValue, shards.front().origin + ": options.fault",
                "unknown fault '" + o.fault + "'");
  }
  if (!properties::parse_profile(o.profile, &options.profile)) {
    throw Error(ErrorId::kJsonValue, shards.front().origin + ": options.profile",
                "unknown profile '" + o.profile + "'");
  }
  std::vector<properties::CaseTally> tallies;
  for (const auto& shard : shards) {
    tallies.push_back(
        reports::tally_from_json(shard, o.cases, properties::coverage_names(options.profile).size()));
    if (tallies.back().reachable != tallies.front().reachable) {
      throw Error(ErrorId::kShard, shard.origin,
                  "its cache reaches other coverage classes than " + shards.front().origin +
                      "'s: not the same cache");
    }
  }
  reports::Report report;
  report.context = report_context(o.command, o.seed, o.impl, options.run.fault, o.precision_requested);
  const properties::CheckResult result =
      properties::finish_check(options, properties::merge_tallies(tallies));
  // A merge ran no case itself: its time is the merge's (with the shrinking).
  const double seconds = seconds_since(start);
  const std::string timing = ran_cases ? timing_text(result.cases, seconds, workers)
                                       : timing_text(-1, seconds, "merging " + workers);
  const int code = report_check(options, result, timing, out_dir, report);
  const int written = write_reports(report, out_dir, code);
  if (written == code) {
    std::printf("reports: %s/report.{json,txt,html}, %s/junit.xml\n", out_dir.string().c_str(),
                out_dir.string().c_str());
  }
  return written;
}

}  // namespace kvcheck::pipelines
