// `kvcheck sweep`: flags in, pipelines/sweep.hpp runs the sweep (sweep/) and
// writes its outputs.
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
// layer or exec:...) loses rows at every capacity tried, or every row was
// unsupported (the cache refused every capacity); 2 bad usage.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/mpi_world.hpp"
#include "cli/progress.hpp"
#include "cli/sweep_flags.hpp"
#include "cli/usage.hpp"
#include "pipelines/sweep.hpp"
#include "properties/memory_estimate.hpp"
#include "reports/output_set.hpp"
#include "support/error.hpp"
#include "scenarios/scenario_json.hpp"
#include "sweep/formula.hpp"
#include "sweep/layer_minima.hpp"
#include "sweep/sweep.hpp"

namespace kvcheck::cli {

namespace {

// Flag limits: far above real engines, low enough that one probe's buffers
// (O(W + max(k + 1, C)) rows) stay small.
constexpr std::int64_t kMaxWindowRows = std::int64_t{1} << 20;
constexpr std::int64_t kMaxDrafts = 4096;
constexpr std::int64_t kMaxChunkRows = std::int64_t{1} << 16;

}  // namespace

int command_sweep(int argc, char** argv) {
  const Args args = command_args(argc, argv, "sweep");
  args.no_positional("sweep");
  if (launched_by_mpi()) {
    // Every rank would sweep the whole grid; a sweep splits with --shard.
    throw Error(ErrorId::kUsage, "mpirun",
                "sweep does not run over MPI ranks; use --shard I/N and kvcheck merge");
  }
  if (const auto file = args.get("--layers-of")) {
    // Per-layer minima of one scenario: no grid, the scenario's own steps.
    properties::RunOptions run;
    if (const auto impl = args.get("--impl")) run.backend = *impl;
    run.step_timeout_seconds = args.seconds("--step-timeout", 10.0, 86400);
    run.probes = false;
    const auto provider = properties::make_provider(run);
    run.provider = provider.get();
    const sweep::LayerMinima m = sweep::layer_minima(scenarios::load_scenario_file(*file), run);
    std::fputs(sweep::layer_minima_text(m).c_str(), stdout);
    const bool safe = m.sliding_min >= 0 && m.global_min >= 0;
    return safe ? 0 : 1;
  }
  pipelines::SweepRequest request;
  sweep::SweepGrid& grid = request.grid;
  grid = sweep::default_grid();
  if (const auto v = args.get("--window")) grid.windows = parse_value_list("--window", *v, 1, kMaxWindowRows);
  if (const auto v = args.get("--drafts")) grid.drafts = parse_value_list("--drafts", *v, 0, kMaxDrafts);
  if (const auto v = args.get("--chunk")) grid.chunks = parse_value_list("--chunk", *v, 1, kMaxChunkRows);
  if (const auto v = args.get("--order")) grid.orders = parse_orders("--order", *v);

  sweep::SweepOptions& options = request.options;
  if (const auto impl = args.get("--impl"); impl && *impl != "cpu") {
    // Any other cache is driven through the step-level interface: each
    // candidate capacity goes to the cache, the worst-case schedule runs.
    if (*impl != "layer" && *impl != "paged" && impl->rfind("exec:", 0) != 0) {
      throw Error(ErrorId::kUsage, "--impl",
                  "sweep runs cpu (the ring pool), paged (the pool over a block table: its pool in blocks), layer "
                  "or exec:'COMMAND ARGS', got '" +
                      *impl + "'");
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
      if (args.has(flag))
        throw Error(ErrorId::kUsage, flag, "goes to `kvcheck merge`, which writes the whole sweep");
    }
    options.shard_index = shard->index;
    options.shard_count = shard->count;
    request.shard = true;
  }
  request.outputs = sweep_output_flags(args);
  {
    // The grid is refused up front when its rows would not fit (a few flags
    // can ask for 10^8 configurations).
    properties::SweepSize size = sweep_size(grid);
    size.states = static_cast<double>(options.probe.states);
    size.threads = options.threads;
    std::string limit_source;
    const std::int64_t limit = memory_limit_flag(args, &limit_source);
    properties::require_memory(properties::estimate_sweep(size), limit, limit_source);
    // ... and its work, when the user bounds it (a grid that fits in memory
    // may still ask for hours: the progress line shows them); a shard runs
    // about 1/N of the configurations.
    properties::SweepSize share = size;
    share.configurations = std::ceil(size.configurations / static_cast<double>(options.shard_count));
    properties::require_sweep_work(share, work_limit_flag(args));
  }
  options.progress = progress_bar("sweep");
  return pipelines::run_capacity_sweep(request);
}

properties::SweepSize sweep_size(const sweep::SweepGrid& grid) {
  properties::SweepSize size;
  const double windows = static_cast<double>(grid.windows.size());
  const double drafts = static_cast<double>(grid.drafts.size());
  const double chunks = static_cast<double>(grid.chunks.size());
  size.configurations = windows * drafts * chunks * static_cast<double>(grid.orders.size());
  for (const auto w : grid.windows) size.max_window = std::max(size.max_window, static_cast<double>(w));
  for (const auto k : grid.drafts) size.max_drafts = std::max(size.max_drafts, static_cast<double>(k));
  for (const auto c : grid.chunks) size.max_chunk = std::max(size.max_chunk, static_cast<double>(c));
  size.widest_flag =
      windows >= drafts && windows >= chunks ? "--window" : (drafts >= chunks ? "--drafts" : "--chunk");
  return size;
}

pipelines::SweepOutputFiles sweep_output_flags(const Args& args) {
  int to_stdout = 0;
  for (const char* flag : {"--json", "--csv", "--svg"}) {
    const auto v = args.get(flag);
    if (v && v->empty()) throw Error(ErrorId::kUsage, flag, "needs a file name or '-'");
    if (v == "-") ++to_stdout;
  }
  if (to_stdout > 1) throw Error(ErrorId::kUsage, "--json", "at most one of --json, --csv, --svg may be '-'");
  std::vector<reports::NamedOutput> named;
  for (const char* flag : {"--json", "--csv", "--svg"}) {
    if (const auto v = args.get(flag); v && *v != "-") named.push_back({flag, *v});
  }
  reports::require_distinct_outputs(named);
  return {args.get("--json"), args.get("--csv"), args.get("--svg")};
}

}  // namespace kvcheck::cli
