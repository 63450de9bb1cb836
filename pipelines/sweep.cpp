#include "pipelines/sweep.hpp"

#include <chrono>
#include <cstdio>
#include <system_error>

#include "reports/report.hpp"
#include "support/atomic_write.hpp"
#include "support/error.hpp"
#include "sweep/sweep_output.hpp"
#include "pipelines/sweep_shard.hpp"

namespace kvcheck::pipelines {

namespace {

/// `text` to stdout for "-", else atomically into `file`.
void emit(const std::string& file, const std::string& text) {
  if (file == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  } else {
    write_file_atomic(file, text);
  }
}

}  // namespace

int run_capacity_sweep(const SweepRequest& request) {
  const sweep::SweepOptions& options = request.options;
  if (request.shard) {
    // The shard document goes into --out: refuse a bad one before any work.
    std::error_code ec;
    std::filesystem::create_directories(options.out_dir, ec);
    if (ec || !std::filesystem::is_directory(options.out_dir)) {
      throw Error(ErrorId::kIo, "--out", "cannot create directory '" + options.out_dir.string() + "'");
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const sweep::SweepResult result = sweep::run_sweep(request.grid, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!request.shard) {
    return write_sweep_outputs(result, request.outputs, seconds,
                               std::to_string(options.threads) + " threads");
  }
  // One shard of a split sweep: its rows and counterexamples in --out;
  // `kvcheck merge` writes the outputs of the whole sweep.
  const std::filesystem::path file = options.out_dir / pipelines::kShardFileName;
  const nlohmann::ordered_json rows =
      pipelines::sweep_shard_rows_json(result, options.shard_index, options.shard_count);
  write_file_atomic(file, pipelines::shard_text("sweep", reports::ReportContext{}.tool_version,
                                              options.shard_index, options.shard_count,
                                              pipelines::sweep_shard_options_json(request.grid, options), rows));
  std::printf(
      "sweep shard %lld/%lld: %zu of %lld configurations, %.2f s on %d threads\nshard: %s (join the shards "
      "with kvcheck merge)\n",
      static_cast<long long>(options.shard_index), static_cast<long long>(options.shard_count),
      rows["rows"].size(), static_cast<long long>(request.grid.size()), seconds, options.threads,
      file.string().c_str());
  return 0;
}

sweep::SweepResult merge_sweep(const std::vector<pipelines::ShardResult>& shards,
                               const std::filesystem::path& out_dir) {
  sweep::SweepResult result = pipelines::merge_sweep_shards(shards);
  pipelines::adopt_counterexamples(result, out_dir);
  return result;
}

int write_sweep_outputs(const sweep::SweepResult& result, const SweepOutputFiles& outputs, double seconds,
                        const std::string& workers) {
  if (outputs.json) emit(*outputs.json, sweep::sweep_json(result));
  if (outputs.csv) emit(*outputs.csv, sweep::sweep_csv(result));
  if (outputs.svg) emit(*outputs.svg, sweep::sweep_svg(result));
  if (outputs.json != "-" && outputs.csv != "-" && outputs.svg != "-") {
    const std::string table = sweep::sweep_table(result);
    std::fwrite(table.data(), 1, table.size(), stdout);
  }
  std::fprintf(stderr, "kvcheck sweep: %lld configuration(s), %lld probes, %.2f s on %s\n",
               static_cast<long long>(result.rows.size()), static_cast<long long>(result.probes), seconds,
               workers.c_str());
  // What the worst-case schedules hold, and what only `kvcheck check` draws
  // (docs/sweep.md "What the schedules include").
  std::fprintf(stderr,
               "kvcheck sweep: worst-case schedules of decode, verify(k) with accept and prefill chunks in the "
               "grid's orders, on one layer's window (a window per layer: --layers-of); trims and shared "
               "prefixes are not swept (kvcheck check draws them where the cache declares them)\n");
  if (result.formula && result.formula_unsafe_rows > 0) {
    std::fprintf(stderr, "kvcheck sweep: formula '%s' is unsafe on %lld of %lld configurations\n",
                 result.formula->c_str(), static_cast<long long>(result.formula_unsafe_rows),
                 static_cast<long long>(result.rows.size()));
  }
  if (result.replay_failures > 0) {
    std::fprintf(stderr,
                 "kvcheck sweep: %lld counterexample(s) did not replay through the reference runner\n",
                 static_cast<long long>(result.replay_failures));
  }
  if (result.no_safe_rows > 0) {
    std::fprintf(stderr, "kvcheck sweep: %lld configuration(s) lose rows at every capacity tried\n",
                 static_cast<long long>(result.no_safe_rows));
  }
  if (result.unsupported_rows > 0) {
    std::fprintf(stderr,
                 "kvcheck sweep: %lld of %lld configuration(s) unsupported (every capacity refused)\n",
                 static_cast<long long>(result.unsupported_rows), static_cast<long long>(result.rows.size()));
  }
  // Nothing measured at all is no answer: a sweep whose every row was refused fails.
  const bool nothing_ran =
      !result.rows.empty() && result.unsupported_rows == static_cast<std::int64_t>(result.rows.size());
  return (result.formula && result.formula_unsafe_rows > 0) || result.replay_failures > 0 ||
                 result.no_safe_rows > 0 || nothing_ran
             ? 1
             : 0;
}

}  // namespace kvcheck::pipelines
