#include "cli/commands.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>

#include "cli/args.hpp"
#include "cli/mpi_world.hpp"
#include "engines/factory.hpp"
#include "engines/trace_cache.hpp"
#include "impl/kv_cache.hpp"
#include "model/spec_report.hpp"
#include "model/trace.hpp"
#include "properties/audit.hpp"
#include "properties/check.hpp"
#include "properties/memory_estimate.hpp"
#include "properties/runner.hpp"
#include "reports/atomic_write.hpp"
#include "reports/report.hpp"
#include "reports/report_html.hpp"
#include "reports/report_json.hpp"
#include "reports/report_junit.hpp"
#include "reports/report_text.hpp"
#include "reports/shard.hpp"
#include "reports/sweep/sweep.hpp"
#include "reports/sweep/sweep_output.hpp"
#include "reports/sweep/sweep_shard.hpp"
#include "reports/trace_table.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"

#ifndef KVCHECK_SOURCE_DIR
#define KVCHECK_SOURCE_DIR "."
#endif

namespace kvcheck::cli {

namespace {

namespace fs = std::filesystem;

/// The command line as reports record it: without --out, --threads and
/// --shard, which never change a result, so the report of a run does not
/// depend on where it was written, on how many threads ran it, or on how it
/// was split into shards (a merged run writes the bytes of one process).
std::string command_line(int argc, char** argv) {
  std::string s = "kvcheck";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string flag = a.substr(0, a.find('='));
    if (flag == "--out" || flag == "--threads" || flag == "--shard") {
      if (a == flag) ++i;  // the value is the next argument
      continue;
    }
    s += " " + a;
  }
  return s;
}

impl::Fault fault_flag(const Args& args) {
  impl::Fault fault = impl::Fault::kNone;
  const std::string name = args.get_or("--fault", "none");
  if (!impl::parse_fault(name, &fault)) {
    throw Error(ErrorId::kUsage, "--fault", "unknown fault '" + name + "' (see `kvcheck faults`)");
  }
  return fault;
}

/// The memory a run may use: --memory-limit, else what the machine has free.
std::int64_t memory_limit_flag(const Args& args, std::string* source) {
  if (const auto text = args.get("--memory-limit")) {
    *source = "--memory-limit";
    return properties::parse_memory_limit("--memory-limit", *text);
  }
  std::string from;
  const std::int64_t bytes = properties::available_memory_bytes(&from);
  *source = from + "; --memory-limit sets another limit";
  return bytes;
}

/// --profile: default | production.
properties::Profile profile_flag(const Args& args) {
  properties::Profile profile = properties::Profile::kDefault;
  const std::string name = args.get_or("--profile", "default");
  if (!properties::parse_profile(name, &profile)) {
    throw Error(ErrorId::kUsage, "--profile", "must be default or production, got '" + name + "'");
  }
  return profile;
}

int precision_flag(const Args& args) {
  const auto bits = args.integer("--precision", 113, 1, 1024);
  if (bits != 53 && bits != 113 && bits != 169) {
    throw Error(ErrorId::kUsage, "--precision", "must be 53, 113 (default) or 169 bits");
  }
  return static_cast<int>(bits);
}

/// --impl: cpu, cuda, layer or exec:'COMMAND'. Backends are checked here
/// (a missing CUDA device is one line before any work); an exec adapter is
/// started by the run itself.
std::string impl_flag(const Args& args) {
  const std::string name = args.get_or("--impl", "cpu");
  if (name == "cpu" || name == "cuda") {
    std::string why;
    if (!impl::make_backend(name, &why)) throw Error(ErrorId::kDevice, "--impl", why);
  } else if (name != "layer" && !engines::is_exec(name)) {
    throw Error(ErrorId::kUsage, "--impl", "unknown cache '" + name + "' (cpu, cuda, layer, or exec:'COMMAND ARGS')");
  } else if (name == "exec:") {
    throw Error(ErrorId::kUsage, "--impl", "exec: needs a command, e.g. exec:'python3 adapters/ring_cache.py'");
  }
  return name;
}

double step_timeout_flag(const Args& args) { return args.seconds("--step-timeout", 10.0, 86400); }

/// Progress on a terminal only; quiet when stderr is not a terminal.
std::function<void(std::int64_t, std::int64_t)> progress_bar(const char* label) {
  if (!isatty(fileno(stderr))) return nullptr;
  return [label](std::int64_t done, std::int64_t total) {
    const int width = 30;
    const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld", label, std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total));
    if (done >= total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

reports::ReportContext context_for(int argc, char** argv, std::uint64_t seed,
                                   const std::string& backend, impl::Fault fault) {
  reports::ReportContext ctx;
  ctx.seed = seed;
  ctx.backend = backend;
  ctx.fault = std::string(impl::fault_name(fault));
  ctx.command = command_line(argc, argv);
  return ctx;
}

/// Makes sure `dir` exists and takes files, before any work is done (a bad
/// --out is one line and exit 2 up front, not after every case has run).
void prepare_out_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw Error(ErrorId::kIo, "--out", "cannot create directory '" + dir.string() + "': " +
                                           (ec ? ec.message() : std::string("a file is in the way")));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error(ErrorId::kIo, "--out", "directory '" + dir.string() + "' is not writable");
  }
}

/// The report set of `report` in `dir`: the counterexample (if any) and the
/// four reports, written together or not at all; returns `code` (see
/// write_set_keeping_verdict).
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

/// Runs `scenarios` through a recording wrapper around the cache `options`
/// names, appending every run to `trace` (the `--record` format, read back by
/// `kvcheck audit`).
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
    summary.replay_command =
        "kvcheck replay " + properties::shell_quote(file.string()) + " " + properties::replay_arguments(options.run);
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
    std::printf("counterexample: %zu requests, %zu steps (shrunk from %zu steps in %lld runs), case seed %llu\n",
                result.shrunk.requests.size(), result.shrunk.steps.size(),
                result.original.steps.size(), static_cast<long long>(result.shrink_runs),
                static_cast<unsigned long long>(result.failing_case_seed));
    std::printf("  first failure: %s\n", result.shrunk_run.first_failure.c_str());
    std::printf("  written to %s\n  replay: %s\n", summary.counterexample_file.c_str(),
                summary.replay_command.c_str());
  }
  std::printf("time: %s\n", timing.c_str());
  return result.found_failure || !result.coverage_ok ? 1 : 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

/// Runs kvcheck check with these options; fills `report` and returns the exit code.
int run_check_into(const properties::CheckOptions& options, const fs::path& out_dir,
                   reports::Report& report) {
  const auto start = std::chrono::steady_clock::now();
  const properties::CheckResult result = properties::run_check(options);
  return report_check(options, result, timing_text(result.cases, seconds_since(start), std::to_string(options.threads) + " threads"),
                      out_dir, report);
}

// ---- split runs: --shard, MPI ranks, kvcheck merge -----------------------------

/// The options every shard of one check must share.
reports::CheckShardOptions shard_options(const properties::CheckOptions& options, const std::string& command) {
  reports::CheckShardOptions o;
  o.impl = options.run.backend;
  o.fault = std::string(impl::fault_name(options.run.fault));
  o.cases = options.cases;
  o.seed = options.seed;
  o.precision_bits = options.run.precision_bits;
  o.step_timeout_seconds = options.run.step_timeout_seconds;
  o.command = command;
  o.profile = properties::profile_name(options.profile);
  return o;
}

/// This process's shard of a check, as a shard document.
std::string check_shard_text(const properties::CheckOptions& options, const std::string& command,
                             const properties::CaseTally& tally) {
  return reports::shard_text("check", reports::ReportContext{}.tool_version, options.shard.index, options.shard.count,
                             reports::check_options_json(shard_options(options, command)),
                             reports::tally_json(tally));
}

/// The report of a whole check from its shards (already ordered by
/// reports::order_shards): the tallies added, the lowest failing case shrunk
/// once here, the report written to `out_dir`. Returns the exit code.
int merge_check(const std::vector<reports::ShardResult>& shards, const fs::path& out_dir, const std::string& workers,
                std::chrono::steady_clock::time_point start, bool ran_cases) {
  const reports::CheckShardOptions o = reports::check_options_from_json(shards.front());
  properties::CheckOptions options;
  options.cases = o.cases;
  options.seed = o.seed;
  options.run.backend = o.impl;
  options.run.precision_bits = o.precision_bits;
  options.run.step_timeout_seconds = o.step_timeout_seconds;
  if (!impl::parse_fault(o.fault, &options.run.fault)) {
    throw Error(ErrorId::kJsonValue, shards.front().origin + ": options.fault", "unknown fault '" + o.fault + "'");
  }
  if (!properties::parse_profile(o.profile, &options.profile)) {
    throw Error(ErrorId::kJsonValue, shards.front().origin + ": options.profile", "unknown profile '" + o.profile + "'");
  }
  std::vector<properties::CaseTally> tallies;
  for (const auto& shard : shards) {
    tallies.push_back(reports::tally_from_json(shard, o.cases, properties::coverage_names(options.profile).size()));
    if (tallies.back().reachable != tallies.front().reachable) {
      throw Error(ErrorId::kShard, shard.origin, "its cache reaches other coverage classes than " +
                                                     shards.front().origin + "'s: not the same cache");
    }
  }
  reports::Report report;
  report.context.seed = o.seed;
  report.context.backend = o.impl;
  report.context.fault = o.fault;
  report.context.precision_bits = o.precision_bits;
  report.context.command = o.command;
  const properties::CheckResult result = properties::finish_check(options, properties::merge_tallies(tallies));
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

/// `mpirun -n R kvcheck check ...`: rank r runs shard r/R; rank 0 gathers
/// every rank's shard document (or its error) and writes the report of the
/// whole run. A rank that failed makes the run fail with exit 2 naming it;
/// nothing is written then.
int check_over_mpi(MpiWorld& world, properties::CheckOptions options, const std::string& command,
                   const fs::path& out) {
  const auto start = std::chrono::steady_clock::now();
  const bool root = world.rank() == 0;
  options.shard = {world.rank(), world.size()};
  if (!root) options.progress = nullptr;
  // Every rank reaches the gather, whatever happened: an error travels to
  // rank 0 as the rank's message instead of leaving the others waiting.
  static constexpr std::string_view kErrorMark = "kvcheck-rank-error\n";
  std::string mine;
  try {
    if (root) prepare_out_dir(out);
    mine = check_shard_text(options, command, properties::run_cases(options));
  } catch (const std::exception& e) {
    mine = std::string(kErrorMark) + e.what();
  }
  const std::vector<std::string> all = world.gather(mine);
  if (!root) return 0;
  std::vector<reports::ShardResult> shards;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::string origin = "rank " + std::to_string(r);
    if (all[r].rfind(kErrorMark, 0) == 0) {
      throw Error(ErrorId::kShard, origin + " of " + std::to_string(all.size()),
                  "failed, so the run is incomplete and no report was written: " + all[r].substr(kErrorMark.size()));
    }
    shards.push_back(reports::parse_shard(all[r], origin));
  }
  return merge_check(reports::order_shards(std::move(shards)), out, std::to_string(world.size()) + " MPI ranks",
                     start, true);
}

}  // namespace

/// Writes `files` as one set (reports/output_set.hpp) and returns `code`.
/// When writing fails the verdict stays visible: the error line goes to
/// stderr, and a failed property still exits 1 (2 only when everything
/// passed but its files could not be written). No file of the set, and none
/// of an earlier run's at the same paths, is left behind.
int write_set_keeping_verdict(const std::vector<reports::OutputFile>& files, int code) {
  try {
    reports::write_output_set(files);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fprintf(stderr, "kvcheck: the verdict (%s) stands; its files were not written\n",
                 code == 1 ? "FAIL" : code == 0 ? "PASS" : "error");
    return code == 1 ? 1 : 2;
  }
  return code;
}

int command_spec(int argc, char** argv) {
  Args args(argc, argv, 2, {}, {});
  args.no_positional("spec");
  const auto lines = model::reproduce_spec();
  std::fputs(model::spec_table(lines).c_str(), stdout);
  for (const auto& l : lines) {
    if (!l.match) return 1;
  }
  return 0;
}

int command_faults(int argc, char** argv) {
  Args args(argc, argv, 2, {}, {});
  args.no_positional("faults");
  for (int f = 1; f < impl::kFaultCount; ++f) {
    const auto fault = static_cast<impl::Fault>(f);
    std::printf("%-26s %s\n", std::string(impl::fault_name(fault)).c_str(),
                std::string(impl::fault_description(fault)).c_str());
  }
  return 0;
}

int command_trace(int argc, char** argv) {
  Args args(argc, argv, 2, {"--window", "--ring", "--state", "--positions"}, {"--json"});
  args.no_positional("trace");
  for (const char* required : {"--window", "--ring", "--state", "--positions"}) {
    if (!args.get(required)) throw Error(ErrorId::kUsage, required, "is required");
  }
  constexpr std::int64_t kMax = std::int64_t{1} << 40;
  const std::int64_t window = args.integer("--window", 0, 1, kMax);
  const std::int64_t ring = args.integer("--ring", 0, 1, kMax);
  const std::int64_t state = args.integer("--state", 0, 0, kMax);
  const auto positions = args.integers("--positions", 0, kMax);
  if (state > 0 && ring > kMax / (state + 1)) {
    throw Error(ErrorId::kSize, "--state", "state * ring overflows the slot range");
  }
  std::vector<reports::TraceLine> lines;
  for (const auto& r : model::ring_trace(window, ring, state, positions)) {
    lines.push_back({r.position, r.logical_first, r.logical_last, r.first_read_slot,
                     r.last_read_slot, r.write_slot});
  }
  std::fputs(args.has("--json") ? reports::trace_json(lines).c_str()
                                : reports::trace_text(window, ring, state, lines).c_str(),
             stdout);
  return 0;
}

int command_check(int argc, char** argv) {
  Args args(argc, argv, 2,
            {"--impl", "--fault", "--cases", "--seed", "--out", "--threads", "--precision", "--step-timeout", "--record",
             "--shard", "--profile", "--memory-limit"},
            {});
  args.no_positional("check");
  properties::CheckOptions options;
  options.run.backend = impl_flag(args);
  options.run.step_timeout_seconds = step_timeout_flag(args);
  options.run.precision_bits = precision_flag(args);
  options.run.fault = fault_flag(args);
  options.cases = args.integer("--cases", 200, 1, 100000000);
  options.seed = static_cast<std::uint64_t>(args.integer("--seed", 1, 0, INT64_MAX));
  options.threads = static_cast<int>(args.integer("--threads", 2, 1, 256));
  options.profile = profile_flag(args);
  options.progress = progress_bar("check");
  {
    std::string limit_source;
    const std::int64_t limit = memory_limit_flag(args, &limit_source);
    properties::require_memory(properties::estimate_check(options.profile, options.threads), limit, limit_source);
  }
  const fs::path out = args.get_or("--out", "kvcheck-out");
  const std::optional<ShardFlag> shard = args.shard("--shard");
  if (shard && args.has("--record")) {
    throw Error(ErrorId::kUsage, "--record", "records one run; use it with `kvcheck replay` on the merged counterexample, not on a shard");
  }
  if (const std::unique_ptr<MpiWorld> world = join_mpi_world(argc, argv)) {
    if (shard) throw Error(ErrorId::kUsage, "--shard", "not under mpirun: each MPI rank runs one shard by itself");
    if (args.has("--record")) throw Error(ErrorId::kUsage, "--record", "not under mpirun (use it with `kvcheck replay`)");
    return check_over_mpi(*world, options, command_line(argc, argv), out);
  }
  prepare_out_dir(out);
  if (shard) {
    // One shard of a split run: its cases only, no shrinking, no report;
    // `kvcheck merge` joins the shards. Exit 0 once the shard is written.
    const auto start = std::chrono::steady_clock::now();
    options.shard = {shard->index, shard->count};
    const properties::CaseTally tally = properties::run_cases(options);
    const fs::path file = out / reports::kShardFileName;
    reports::write_file_atomic(file, check_shard_text(options, command_line(argc, argv), tally));
    std::printf("check shard %lld/%lld: %lld of %lld cases, %lld failing", static_cast<long long>(shard->index),
                static_cast<long long>(shard->count), static_cast<long long>(tally.cases),
                static_cast<long long>(options.cases), static_cast<long long>(tally.failures));
    if (tally.first_failing_case >= 0) std::printf(" (lowest case %lld)", static_cast<long long>(tally.first_failing_case));
    std::printf(", %.2f s on %d threads\nshard: %s (join the shards with kvcheck merge)\n", seconds_since(start),
                options.threads, file.string().c_str());
    return 0;
  }
  reports::Report report;
  report.context = context_for(argc, argv, options.seed, options.run.backend, options.run.fault);
  report.context.precision_bits = options.run.precision_bits;
  // The trace file is opened (and truncated) before any work: a bad path is exit 2 up front.
  std::shared_ptr<scenarios::TraceWriter> trace;
  if (const auto f = args.get("--record")) trace = std::make_shared<scenarios::TraceWriter>(fs::path(*f));
  const int checked = run_check_into(options, out, report);
  const int code = write_reports(report, out, checked);
  if (code != checked) return code;
  std::printf("reports: %s/report.{json,txt,html}, %s/junit.xml\n", out.string().c_str(),
              out.string().c_str());
  if (trace) {
    // The counterexample when a case failed, else case 0: one run a reader can audit.
    const scenarios::Scenario sc = report.check && !report.check->counterexample_file.empty()
                                       ? scenarios::load_scenario_file(report.check->counterexample_file)
                                       : properties::generate_scenario(properties::case_seed(options.seed, 0),
                                                                       properties::make_provider(options.run)->capabilities(),
                                                                       options.profile);
    record_runs({sc}, options.run, trace);
    std::printf("trace: %s\n", args.get("--record")->c_str());
  }
  return code;
}

int command_merge(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  Args args(argc, argv, 2, {"--out", "--json", "--csv", "--svg"}, {});
  if (args.positional().empty()) throw Error(ErrorId::kUsage, "SHARD_DIR", "merge needs the shard directories");
  // Every shard is read and checked before anything is written.
  std::vector<reports::ShardResult> shards;
  for (const auto& dir : args.positional()) shards.push_back(reports::read_shard_dir(dir));
  shards = reports::order_shards(std::move(shards));
  const std::string workers = std::to_string(shards.size()) + " shards";
  if (shards.front().kind == "check") {
    for (const char* flag : {"--json", "--csv", "--svg"}) {
      if (args.has(flag)) throw Error(ErrorId::kUsage, flag, "is for sweep shards; a check writes its reports into --out");
    }
    const fs::path out = args.get_or("--out", "kvcheck-out");
    prepare_out_dir(out);
    return merge_check(shards, out, workers, start, false);
  }
  sweep::SweepResult result = sweep::merge_sweep_shards(shards);
  sweep::adopt_counterexamples(result, args.get_or("--out", "kvcheck-out/sweep"));
  return sweep_outputs(result, args, seconds_since(start), workers);
}

int command_replay(int argc, char** argv) {
  Args args(argc, argv, 2,
            {"--impl", "--fault", "--report", "--junit", "--html", "--precision", "--step-timeout", "--record",
             "--memory-limit"},
            {});
  if (args.positional().empty()) throw Error(ErrorId::kUsage, "FILE", "replay needs scenario files or directories");
  properties::RunOptions options;
  options.backend = impl_flag(args);
  options.step_timeout_seconds = step_timeout_flag(args);
  options.fault = fault_flag(args);
  options.precision_bits = precision_flag(args);
  const auto files = scenarios::collect_scenario_files(args.positional());
  if (files.empty()) throw Error(ErrorId::kUsage, "FILE", "no *.json scenario files found");
  // Load everything first: a bad file stops the run before anything is written.
  std::vector<scenarios::Scenario> loaded;
  for (const auto& f : files) loaded.push_back(scenarios::load_scenario_file(f));
  reports::Report report;
  report.context = context_for(argc, argv, 0, options.backend, options.fault);
  report.context.precision_bits = options.precision_bits;
  for (std::size_t i = 0; i < loaded.size(); ++i) {
    if (loaded[i].name.empty()) loaded[i].name = files[i].stem().string();
  }
  // Refused before any cache is opened when the runs would not fit.
  std::string limit_source;
  const std::int64_t limit = memory_limit_flag(args, &limit_source);
  properties::require_memory(properties::estimate_replay(loaded, options), limit, limit_source);
  if (const auto f = args.get("--record")) {
    // Every run goes through a recording wrapper; the trace holds them all.
    auto trace = std::make_shared<scenarios::TraceWriter>(fs::path(*f));
    report.runs = record_runs(loaded, options, trace);
  } else {
    // One provider for every file (one adapter process for exec).
    const std::unique_ptr<engines::CacheProvider> provider = properties::make_provider(options);
    options.provider = provider.get();
    for (const auto& sc : loaded) report.runs.push_back(properties::run_scenario(sc, options));
  }
  std::fputs(reports::report_text(report).c_str(), stdout);
  std::vector<reports::OutputFile> outputs;
  if (const auto f = args.get("--report")) outputs.push_back({*f, reports::report_json_text(report)});
  if (const auto f = args.get("--junit")) outputs.push_back({*f, reports::report_junit(report)});
  if (const auto f = args.get("--html")) outputs.push_back({*f, reports::report_html(report)});
  return write_set_keeping_verdict(outputs, report.passed() ? 0 : 1);
}

int command_demo(int argc, char** argv) {
  Args args(argc, argv, 2, {"--cases", "--out", "--scenarios", "--seed"}, {});
  args.no_positional("demo");
  const fs::path out = args.get_or("--out", "kvcheck-out");
  prepare_out_dir(out);
  const std::string bundled = args.get_or("--scenarios", std::string(KVCHECK_SOURCE_DIR) + "/scenarios/fast");
  std::printf("== 1. SPEC §6 reproduced by the reference model (%d-bit MPFR) ==\n", 113);
  const auto lines = model::reproduce_spec();
  std::fputs(model::spec_table(lines).c_str(), stdout);
  bool spec_ok = true;
  for (const auto& l : lines) spec_ok = spec_ok && l.match;

  std::printf("\n== 2. Bundled scenarios replayed on the CPU backend (%s) ==\n", bundled.c_str());
  properties::CheckOptions options;
  options.cases = args.integer("--cases", 300, 1, 100000000);
  options.seed = static_cast<std::uint64_t>(args.integer("--seed", 1, 0, INT64_MAX));
  options.progress = progress_bar("check");
  reports::Report report;
  report.context = context_for(argc, argv, options.seed, "cpu", impl::Fault::kNone);
  for (const auto& f : scenarios::collect_scenario_files({bundled})) {
    report.runs.push_back(properties::run_scenario(scenarios::load_scenario_file(f), options.run));
  }
  std::fputs(reports::report_text(report).c_str(), stdout);

  std::printf("\n== 3. Randomized check of the CPU backend ==\n");
  const int check_code = run_check_into(options, out, report);

  std::printf("\n== 4. Minimum safe ring sizes by simulation (kvcheck sweep) ==\n");
  sweep::SweepGrid grid;
  grid.windows = {128};
  grid.drafts = {0, 1, 5};
  grid.chunks = {1, 64};
  grid.orders = {sweep::SweepOrder::kStoreThenLoad, sweep::SweepOrder::kLoadThenStore};
  sweep::SweepOptions sweep_options;
  sweep_options.counterexamples = sweep::CounterexampleMode::kNone;
  const sweep::SweepResult swept = sweep::run_sweep(grid, sweep_options);
  std::fputs(sweep::sweep_table(swept).c_str(), stdout);

  // An engine's cache in another process, live over the exec protocol: the
  // bundled paged adapter, correct and then with a bug engines have shipped.
  const std::string paged = "exec:python3 " + std::string(KVCHECK_SOURCE_DIR) + "/adapters/paged_cache.py";
  std::printf("\n== 5. An engine in another process: %s ==\n", paged.c_str());
  properties::CheckOptions live = options;
  live.run.backend = paged;
  reports::Report scratch;
  const int live_code = run_check_into(live, out / "exec", scratch);
  std::printf("\n-- the same adapter with --bug free-early (a block freed one step too early) --\n");
  live.run.backend = paged + " --bug free-early";
  const int bug_code = run_check_into(live, out / "exec", scratch);

  const fs::path trace = fs::path(KVCHECK_SOURCE_DIR) / "traces" / "paged-engine-early-free.jsonl";
  std::printf("\n== 6. A recorded trace audited (kvcheck audit %s) ==\n", trace.string().c_str());
  reports::Report audited;
  audited.context = context_for(argc, argv, 0, "trace", impl::Fault::kNone);
  properties::AuditOptions audit_options;
  audited.runs = properties::audit_trace(scenarios::load_trace_file(trace), audit_options);
  std::fputs(reports::report_text(audited).c_str(), stdout);

  // The live runs' counterexample (the bug's) goes to out/exec.
  if (write_set_keeping_verdict(scratch.attachments, 0) != 0) return 2;
  if (write_reports(report, out, 0) != 0) return 2;
  std::printf("\nHTML report: %s/report.html (also report.json, report.txt, junit.xml)\n",
              out.string().c_str());
  // The bug switch and the early-free trace are meant to fail: the demo
  // fails if they do not (kvcheck would have missed a real bug).
  const bool bug_caught = bug_code == 1 && !audited.passed();
  return spec_ok && report.passed() && check_code == 0 && swept.spec_disagreements == 0 && live_code == 0 && bug_caught
             ? 0
             : 1;
}

}  // namespace kvcheck::cli
