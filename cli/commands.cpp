#include "cli/commands.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/mpi_world.hpp"
#include "cli/progress.hpp"
#include "cli/usage.hpp"
#include "engines/factory.hpp"
#include "pipelines/catalog.hpp"
#include "pipelines/check.hpp"
#include "pipelines/demo.hpp"
#include "pipelines/replay.hpp"
#include "pipelines/sweep.hpp"
#include "properties/check.hpp"
#include "properties/memory_estimate.hpp"
#include "properties/option_table.hpp"
#include "properties/runner.hpp"
#include "reports/output_set.hpp"
#include "pipelines/shard.hpp"
#include "reports/trace_table.hpp"
#include "support/error.hpp"

#ifndef KVCHECK_SOURCE_DIR
#define KVCHECK_SOURCE_DIR "."
#endif

namespace kvcheck::cli {

namespace {

namespace fs = std::filesystem;

/// The command line as reports record it: without the options the table
/// does not record (--out, --threads, --shard and --reference, which never
/// change a result), so the report of a run does not depend on where it was
/// written, on how many threads ran it, on how it was split into shards (a
/// merged run writes the bytes of one process), or on how its reference was
/// computed (the same figures).
std::string command_line(int argc, char** argv) {
  std::set<std::string> unrecorded = properties::option_flags(0);
  for (const auto& f : properties::option_flags(properties::kRecorded)) unrecorded.erase(f);
  std::string s = "kvcheck";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string flag = a.substr(0, a.find('='));
    if (unrecorded.count(flag)) {
      if (a == flag) ++i;  // the value is the next argument
      continue;
    }
    s += " " + a;
  }
  return s;
}

/// --fault NAME into `*fault`.
void fault_flag(const Args& args, std::string* fault) {
  const std::string name = args.get_or("--fault", "none");
  *fault = name;
  if (!pipelines::is_fault_name(name)) {
    throw Error(ErrorId::kUsage, "--fault", "unknown fault '" + name + "' (see `kvcheck faults`)");
  }
}

/// --profile: default | production | trim | layers.
properties::Profile profile_flag(const Args& args) {
  properties::Profile profile = properties::Profile::kDefault;
  const std::string name = args.get_or("--profile", "default");
  if (!properties::parse_profile(name, &profile)) {
    throw Error(ErrorId::kUsage, "--profile",
                "must be default, production, trim, layers, prefix or paged, got '" + name + "'");
  }
  return profile;
}

/// --reference certified (default) | mpfr: how the 113/169-bit reference is computed.
properties::Reference reference_flag(const Args& args) {
  const std::string name = args.get_or("--reference", "certified");
  if (name == "certified") return properties::Reference::kCertified;
  if (name == "mpfr") return properties::Reference::kMpfr;
  throw Error(ErrorId::kUsage, "--reference", "must be certified (default) or mpfr, got " + name);
}

/// --impl: cpu, cuda, layer or exec:'COMMAND'. Backends are checked here
/// when `probe` (a missing CUDA device is one line before any work); an exec
/// adapter is started by the run itself.
std::string impl_flag(const Args& args, bool probe, const char* flag = "--impl") {
  const std::string name = args.get_or(flag, "cpu");
  if (name == "cpu" || name == "cuda") {
    if (!probe) return name;
    std::string why;
    if (!pipelines::backend_available(name, &why)) throw Error(ErrorId::kDevice, flag, why);
  } else if (name != "layer" && name != "paged" && !engines::is_exec(name)) {
    throw Error(ErrorId::kUsage, flag,
                "unknown cache '" + name + "' (cpu, cuda, paged, layer, or exec:'COMMAND ARGS')");
  } else if (name == "exec:") {
    throw Error(ErrorId::kUsage, flag,
                "exec: needs a command, e.g. exec:'python3 adapters/ring_cache.py'");
  }
  return name;
}

/// --min-run-share F: the share of generated cases that must run (not be
/// refused or skipped) for `check` to pass; a fraction in [0, 1], default 0.8.
double min_run_share_flag(const Args& args) {
  const auto text = args.get("--min-run-share");
  if (!text) return properties::CheckOptions{}.min_run_share;
  char* end = nullptr;
  const double share = std::strtod(text->c_str(), &end);
  if (text->empty() || end != text->c_str() + text->size() || !(share >= 0 && share <= 1)) {
    throw Error(ErrorId::kUsage, "--min-run-share", "must be a fraction in 0..1, got '" + *text + "'");
  }
  return share;
}

/// --case-seed X: one case, the one case seed X draws (0 .. 2^64 - 1, as a
/// failing check prints it); not with --cases, and without the coverage gate
/// (one case reaches few classes).
void case_seed_flag(const Args& args, properties::CheckOptions* options) {
  const auto text = args.get("--case-seed");
  if (!text) return;
  if (args.has("--cases")) throw Error(ErrorId::kUsage, "--case-seed", "runs one case: not with --cases");
  errno = 0;
  char* end = nullptr;
  const unsigned long long seed = std::strtoull(text->c_str(), &end, 10);
  if (text->empty() || text->find_first_not_of("0123456789") != std::string::npos || errno == ERANGE) {
    throw Error(ErrorId::kUsage, "--case-seed",
                "expects a case seed, a decimal integer in 0..18446744073709551615, got '" + *text + "'");
  }
  options->only_case_seed = static_cast<std::uint64_t>(seed);
  options->cases = 1;
  options->coverage_gate = false;
}

/// --exec-encoding json|binary: whether hello offers an exec adapter binary
/// frames (adapters/PROTOCOL.md "Binary frames"); default json.
engines::ExecEncoding exec_encoding_flag(const Args& args) {
  const auto text = args.get("--exec-encoding");
  if (!text || *text == "json") return engines::ExecEncoding::kJson;
  if (*text == "binary") return engines::ExecEncoding::kBinary;
  throw Error(ErrorId::kUsage, "--exec-encoding", "expects json or binary, got '" + *text + "'");
}

double step_timeout_flag(const Args& args) {
  return args.seconds("--step-timeout", 10.0, 86400);
}

/// --threads T.
int threads_flag(const Args& args) {
  return static_cast<int>(args.integer("--threads", 2, 1, 256));
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
    if (root) pipelines::prepare_out_dir(out);
    mine = pipelines::check_shard_text(options, command, properties::run_cases(options));
  } catch (const std::exception& e) {
    mine = std::string(kErrorMark) + e.what();
  }
  const std::vector<std::string> all = world.gather(mine);
  if (!root) return 0;
  std::vector<pipelines::ShardResult> shards;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::string origin = "rank " + std::to_string(r);
    if (all[r].rfind(kErrorMark, 0) == 0) {
      throw Error(
          ErrorId::kShard, origin + " of " + std::to_string(all.size()),
          "failed, so the run is incomplete and no report was written: " + all[r].substr(kErrorMark.size()));
    }
    shards.push_back(pipelines::parse_shard(all[r], origin));
  }
  return pipelines::merge_check(pipelines::order_shards(std::move(shards)), out,
                                std::to_string(world.size()) + " MPI ranks", start, true, options.run.backend);
}

}  // namespace

properties::CheckOptions read_check_options(const Args& args, bool probe_backend) {
  using properties::CheckOption;
  properties::CheckOptions options;
  for (const properties::OptionRow& row : properties::kCheckOptions) {
    switch (row.id) {
      case CheckOption::kImpl:
        options.run.backend = impl_flag(args, probe_backend);
        break;
      case CheckOption::kFault:
        fault_flag(args, &options.run.fault);
        break;
      case CheckOption::kAgainst:
        if (args.has("--against")) options.run.against = impl_flag(args, probe_backend, "--against");
        break;
      case CheckOption::kBitwise:
        options.run.bitwise = args.has("--bitwise");
        break;
      case CheckOption::kRepeatBitwise:
        options.run.repeat_bitwise = args.has("--repeat-bitwise");
        break;
      case CheckOption::kPrecision:
        options.run.precision_bits = precision_flag(args);
        break;
      case CheckOption::kStepTimeout:
        options.run.step_timeout_seconds = step_timeout_flag(args);
        break;
      case CheckOption::kReference:
        options.run.reference = reference_flag(args);
        break;
      case CheckOption::kExecEncoding:
        options.run.exec_encoding = exec_encoding_flag(args);
        break;
      case CheckOption::kCases:
        options.cases = args.integer("--cases", 200, 1, 100000000);
        break;
      case CheckOption::kSeed:
        options.seed = static_cast<std::uint64_t>(args.integer("--seed", 1, 0, INT64_MAX));
        break;
      case CheckOption::kCaseSeed:
        case_seed_flag(args, &options);
        break;
      case CheckOption::kProfile:
        options.profile = profile_flag(args);
        break;
      case CheckOption::kMinRunShare:
        options.min_run_share = min_run_share_flag(args);
        break;
      case CheckOption::kNoCoverageGate:
        if (args.has("--no-coverage-gate")) options.coverage_gate = false;
        break;
      case CheckOption::kMaxFailures:
        options.max_failures = args.integer("--max-failures", 0, 1, 100000000);
        break;
      case CheckOption::kThreads:
        options.threads = threads_flag(args);
        break;
      // Read by the command itself: where files go, the shard, the memory and work limits.
      case CheckOption::kMemoryLimit:
      case CheckOption::kWorkLimit:
      case CheckOption::kRecord:
      case CheckOption::kShard:
      case CheckOption::kOut:
      case CheckOption::kReport:
      case CheckOption::kJunit:
      case CheckOption::kHtml:
        break;
    }
  }
  if (options.run.bitwise && options.run.against.empty()) {
    throw Error(ErrorId::kUsage, "--bitwise",
                "compares the outputs of --impl and --against bit for bit: give --against IMPL "
                "(--repeat-bitwise compares two runs of one cache)");
  }
  if (options.run.repeat_bitwise && !options.run.against.empty()) {
    throw Error(ErrorId::kUsage, "--repeat-bitwise",
                "runs one cache twice: not with --against (use --against IMPL --bitwise for two caches)");
  }
  return options;
}

/// --against and --repeat-bitwise run each case on two caches in one
/// process: not split into shards, not recorded as one trace.
void refuse_side_by_side(const properties::CheckOptions& options, const char* flag, const char* why) {
  if (!properties::runs_side_by_side(options.run)) return;
  throw Error(ErrorId::kUsage, flag,
              std::string("not with ") + (options.run.against.empty() ? "--repeat-bitwise" : "--against") + ": " +
                  why);
}

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

std::optional<std::int64_t> work_limit_flag(const Args& args) {
  if (const auto text = args.get("--work-limit")) return properties::parse_work_limit("--work-limit", *text);
  return std::nullopt;
}

int command_spec(int argc, char** argv) {
  Args args = command_args(argc, argv, "spec");
  args.no_positional("spec");
  bool all_match = true;
  std::fputs(pipelines::spec_table(&all_match).c_str(), stdout);
  return all_match ? 0 : 1;
}

int command_faults(int argc, char** argv) {
  Args args = command_args(argc, argv, "faults");
  args.no_positional("faults");
  std::fputs(pipelines::fault_table().c_str(), stdout);
  return 0;
}

int command_trace(int argc, char** argv) {
  Args args = command_args(argc, argv, "trace");
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
  const std::vector<reports::TraceLine> lines = pipelines::ring_trace_lines(window, ring, state, positions);
  std::fputs(args.has("--json") ? reports::trace_json(lines).c_str()
                                : reports::trace_text(window, ring, state, lines).c_str(),
             stdout);
  return 0;
}

int command_check(int argc, char** argv) {
  Args args = command_args(argc, argv, "check");
  args.no_positional("check");
  properties::CheckOptions options = read_check_options(args, true);
  options.progress = progress_bar("check");
  options.activity = activity_line("check");
  {
    std::string limit_source;
    const std::int64_t limit = memory_limit_flag(args, &limit_source);
    // Side by side, each worker holds two caches at a time (and keeps every read and output of a case).
    const int caches = options.threads * (properties::runs_side_by_side(options.run) ? 2 : 1);
    properties::require_memory(properties::estimate_check(options.profile, caches), limit, limit_source);
    // Side by side, every case runs twice.
    properties::require_check_work(options.profile, options.cases * (caches / options.threads),
                                   work_limit_flag(args));
  }
  const fs::path out = args.get_or("--out", "kvcheck-out");
  const std::optional<ShardFlag> shard = args.shard("--shard");
  if (shard) refuse_side_by_side(options, "--shard", "two caches side by side run in one process");
  const auto refuse_max_failures = [&options](const char* where) {
    if (options.max_failures == 0) return;
    throw Error(ErrorId::kUsage, "--max-failures",
                std::string("stops one process's check at its N-th failing case: not ") + where +
                    " (each shard runs all its cases; the merge shrinks the lowest failing one)");
  };
  if (shard) refuse_max_failures("with --shard");
  if (args.has("--record")) refuse_side_by_side(options, "--record", "a trace records one cache's runs");
  if (shard && args.has("--record")) {
    throw Error(ErrorId::kUsage, "--record",
                "records one run; use it with `kvcheck replay` on the merged counterexample, not on a shard");
  }
  if (const std::unique_ptr<MpiWorld> world = join_mpi_world(argc, argv)) {
    if (shard)
      throw Error(ErrorId::kUsage, "--shard", "not under mpirun: each MPI rank runs one shard by itself");
    if (args.has("--record"))
      throw Error(ErrorId::kUsage, "--record", "not under mpirun (use it with `kvcheck replay`)");
    refuse_side_by_side(options, "mpirun", "two caches side by side run in one process");
    refuse_max_failures("under mpirun");
    return check_over_mpi(*world, options, command_line(argc, argv), out);
  }
  pipelines::prepare_out_dir(out);
  if (shard) {
    // One shard of a split run: its cases only, no shrinking, no report;
    // `kvcheck merge` joins the shards. Exit 0 once the shard is written.
    options.shard = {shard->index, shard->count};
    return pipelines::run_check_shard(options, command_line(argc, argv), out);
  }
  std::optional<std::string> record;
  if (const auto f = args.get("--record")) {
    // Written with the report set: it must not be one of its files.
    record = *f;
    std::vector<reports::NamedOutput> named = pipelines::report_set_outputs(out);
    named.push_back({"--record", *record});
    reports::require_distinct_outputs(named);
    reports::require_writable_output(named.back());
  }
  return pipelines::run_check(options, command_line(argc, argv), out, record);
}

// command_merge: cli/merge_command.cpp.

int command_replay(int argc, char** argv) {
  Args args = command_args(argc, argv, "replay");
  if (args.positional().empty())
    throw Error(ErrorId::kUsage, "FILE", "replay needs scenario files or directories");
  pipelines::ReplayRequest request;
  const properties::CheckOptions options = read_check_options(args, true);
  if (args.has("--record")) refuse_side_by_side(options, "--record", "a trace records one cache's runs");
  request.run = options.run;
  request.command = command_line(argc, argv);
  if (const auto f = args.get("--record")) request.record = *f;
  if (const auto f = args.get("--report")) request.files.json = *f;
  if (const auto f = args.get("--junit")) request.files.junit = *f;
  if (const auto f = args.get("--html")) request.files.html = *f;
  {
    // One file per output, each in a directory that takes it, before any run.
    std::vector<reports::NamedOutput> named = pipelines::named_outputs(request.files);
    if (request.record) named.push_back({"--record", *request.record});
    reports::require_distinct_outputs(named);
    for (const auto& o : named) reports::require_writable_output(o);
  }
  // The order of errors: every file is read before --memory-limit is.
  const std::vector<scenarios::Scenario> loaded = pipelines::load_replay_scenarios(args.positional());
  std::string limit_source;
  const std::int64_t limit = memory_limit_flag(args, &limit_source);
  request.work_limit = work_limit_flag(args);
  request.progress = progress_bar("replay");
  return pipelines::run_replay(loaded, request, limit, limit_source);
}

int command_demo(int argc, char** argv) {
  Args args = command_args(argc, argv, "demo");
  args.no_positional("demo");
  pipelines::DemoOptions demo;
  demo.out_dir = args.get_or("--out", "kvcheck-out");
  pipelines::prepare_out_dir(demo.out_dir);
  demo.source_dir = KVCHECK_SOURCE_DIR;
  demo.scenarios_dir = args.get_or("--scenarios", std::string(KVCHECK_SOURCE_DIR) + "/scenarios/fast");
  demo.cases = args.integer("--cases", 300, 1, 100000000);
  demo.seed = static_cast<std::uint64_t>(args.integer("--seed", 1, 0, INT64_MAX));
  demo.command = command_line(argc, argv);
  demo.progress = progress_bar("check");
  return pipelines::run_demo(demo);
}

}  // namespace kvcheck::cli
