// `kvcheck sweep`: flags in, sweep/ does the work.
//
//   kvcheck sweep --window A[:B[:STEP]] --drafts K1[:K2] --chunk C1[:C2]
//                 --order store-then-load|load-then-store|both [--states N]
//                 [--json FILE] [--csv FILE] [--svg FILE] [--formula EXPR]
//                 [--out DIR] [--counterexamples auto|all|none] [--threads T]
//
// Every range flag also takes comma-separated items (`--chunk 1,16,256`).
// Omitted flags take the default grid (W 64..4096 step 64, k 0..16,
// C 1,16,256, both orders). FILE may be `-` (stdout; at most one of them);
// otherwise a table goes to stdout. Exit codes: 0 every configuration was
// computed (and --formula, if given, is safe everywhere); 1 the formula is
// unsafe somewhere, a counterexample did not replay, or a live cache (--impl
// layer or exec:...) loses rows at every capacity tried; 2 bad usage.

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/mpi_world.hpp"
#include "cli/progress.hpp"
#include "cli/sweep_flags.hpp"
#include "support/atomic_write.hpp"
#include "reports/report.hpp"
#include "reports/shard.hpp"
#include "sweep/sweep.hpp"
#include "sweep/sweep_output.hpp"
#include "sweep/sweep_shard.hpp"
#include "support/error.hpp"

namespace kvcheck::cli {

namespace {

// Flag limits: far above real engines, low enough that one probe's buffers
// (O(W + max(k + 1, C)) rows) stay small.
constexpr std::int64_t kMaxWindowRows = std::int64_t{1} << 20;
constexpr std::int64_t kMaxDrafts = 4096;
constexpr std::int64_t kMaxChunkRows = std::int64_t{1} << 16;

void emit(const std::string& file, const std::string& text) {
  if (file == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  } else {
    write_file_atomic(file, text);
  }
}

/// How many of --json, --csv, --svg go to stdout ('-'); refuses more than
/// one and empty names.
int stdout_outputs(const Args& args) {
  int to_stdout = 0;
  for (const char* flag : {"--json", "--csv", "--svg"}) {
    const auto v = args.get(flag);
    if (v && v->empty()) throw Error(ErrorId::kUsage, flag, "needs a file name or '-'");
    if (v == "-") ++to_stdout;
  }
  if (to_stdout > 1) throw Error(ErrorId::kUsage, "--json", "at most one of --json, --csv, --svg may be '-'");
  return to_stdout;
}

}  // namespace

int command_sweep(int argc, char** argv) {
  const Args args(argc, argv, 2,
                  {"--window", "--drafts", "--chunk", "--order", "--states", "--json", "--csv", "--svg",
                   "--formula", "--out", "--counterexamples", "--threads", "--impl", "--step-timeout", "--shard"},
                  {});
  args.no_positional("sweep");
  if (launched_by_mpi()) {
    // Every rank would sweep the whole grid; a sweep splits with --shard.
    throw Error(ErrorId::kUsage, "mpirun", "sweep does not run over MPI ranks; use --shard I/N and kvcheck merge");
  }
  sweep::SweepGrid grid = sweep::default_grid();
  if (const auto v = args.get("--window")) grid.windows = parse_value_list("--window", *v, 1, kMaxWindowRows);
  if (const auto v = args.get("--drafts")) grid.drafts = parse_value_list("--drafts", *v, 0, kMaxDrafts);
  if (const auto v = args.get("--chunk")) grid.chunks = parse_value_list("--chunk", *v, 1, kMaxChunkRows);
  if (const auto v = args.get("--order")) grid.orders = parse_orders("--order", *v);

  sweep::SweepOptions options;
  if (const auto impl = args.get("--impl"); impl && *impl != "cpu") {
    // Any other cache is driven through the step-level interface: each
    // candidate capacity goes to the cache, the worst-case schedule runs.
    if (*impl != "layer" && impl->rfind("exec:", 0) != 0) {
      throw Error(ErrorId::kUsage, "--impl", "sweep runs cpu (the tag engine), layer or exec:'COMMAND ARGS', got '" + *impl + "'");
    }
    options.impl = *impl;
  }
  options.step_timeout_seconds = args.seconds("--step-timeout", 10.0, 86400);
  options.probe.states = args.integer("--states", 2, 1, 64);
  options.threads = static_cast<int>(args.integer("--threads", 2, 1, 64));
  if (const auto f = args.get("--formula")) options.formula = sweep::Formula::parse(*f, "--formula");
  options.out_dir = args.get_or("--out", "kvcheck-out/sweep");
  const std::string mode = args.get_or("--counterexamples", "auto");
  if (mode == "auto") {
    options.counterexamples = sweep::CounterexampleMode::kAuto;
  } else if (mode == "all") {
    options.counterexamples = sweep::CounterexampleMode::kAll;
  } else if (mode == "none") {
    options.counterexamples = sweep::CounterexampleMode::kNone;
  } else {
    throw Error(ErrorId::kUsage, "--counterexamples", "expects auto, all or none, got '" + mode + "'");
  }
  const std::optional<ShardFlag> shard = args.shard("--shard");
  if (shard) {
    for (const char* flag : {"--json", "--csv", "--svg"}) {
      if (args.has(flag)) throw Error(ErrorId::kUsage, flag, "goes to `kvcheck merge`, which writes the whole sweep");
    }
    options.shard_index = shard->index;
    options.shard_count = shard->count;
    // The shard document goes into --out: refuse a bad one before any work.
    std::error_code ec;
    std::filesystem::create_directories(options.out_dir, ec);
    if (ec || !std::filesystem::is_directory(options.out_dir)) {
      throw Error(ErrorId::kIo, "--out", "cannot create directory '" + options.out_dir.string() + "'");
    }
  }
  stdout_outputs(args);
  options.progress = progress_bar("sweep");

  const auto t0 = std::chrono::steady_clock::now();
  const sweep::SweepResult result = sweep::run_sweep(grid, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (shard) {
    // One shard of a split sweep: its rows and counterexamples in --out;
    // `kvcheck merge` writes the outputs of the whole sweep.
    const std::filesystem::path file = options.out_dir / reports::kShardFileName;
    const nlohmann::ordered_json rows = sweep::sweep_shard_rows_json(result, shard->index, shard->count);
    write_file_atomic(file, reports::shard_text("sweep", reports::ReportContext{}.tool_version, shard->index,
                                                         shard->count, sweep::sweep_shard_options_json(grid, options),
                                                         rows));
    std::printf("sweep shard %lld/%lld: %zu of %lld configurations, %.2f s on %d threads\nshard: %s (join the shards "
                "with kvcheck merge)\n",
                static_cast<long long>(shard->index), static_cast<long long>(shard->count), rows["rows"].size(),
                static_cast<long long>(grid.size()), seconds, options.threads, file.string().c_str());
    return 0;
  }
  return sweep_outputs(result, args, seconds, std::to_string(options.threads) + " threads");
}

int sweep_outputs(const sweep::SweepResult& result, const Args& args, double seconds, const std::string& workers) {
  const int to_stdout = stdout_outputs(args);
  if (const auto f = args.get("--json")) emit(*f, sweep::sweep_json(result));
  if (const auto f = args.get("--csv")) emit(*f, sweep::sweep_csv(result));
  if (const auto f = args.get("--svg")) emit(*f, sweep::sweep_svg(result));
  if (to_stdout == 0) {
    const std::string table = sweep::sweep_table(result);
    std::fwrite(table.data(), 1, table.size(), stdout);
  }
  std::fprintf(stderr, "kvcheck sweep: %lld configuration(s), %lld probes, %.2f s on %s\n",
               static_cast<long long>(result.rows.size()), static_cast<long long>(result.probes), seconds,
               workers.c_str());
  if (result.formula && result.formula_unsafe_rows > 0) {
    std::fprintf(stderr, "kvcheck sweep: formula '%s' is unsafe on %lld of %lld configurations\n",
                 result.formula->c_str(), static_cast<long long>(result.formula_unsafe_rows),
                 static_cast<long long>(result.rows.size()));
  }
  if (result.replay_failures > 0) {
    std::fprintf(stderr, "kvcheck sweep: %lld counterexample(s) did not replay through the reference runner\n",
                 static_cast<long long>(result.replay_failures));
  }
  if (result.no_safe_rows > 0) {
    std::fprintf(stderr, "kvcheck sweep: %lld configuration(s) lose rows at every capacity tried\n",
                 static_cast<long long>(result.no_safe_rows));
  }
  return (result.formula && result.formula_unsafe_rows > 0) || result.replay_failures > 0 || result.no_safe_rows > 0
             ? 1
             : 0;
}

}  // namespace kvcheck::cli
