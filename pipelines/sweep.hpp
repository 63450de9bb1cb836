// The sweep pipeline behind `kvcheck sweep` and a sweep's `kvcheck merge`:
// the capacity sweep run (sweep/ does the search), then either one shard's
// document in --out or the outputs of the whole sweep (--json, --csv, --svg,
// else the table on stdout; the summary on stderr) and its exit code.
// cli/ reads and checks the flags into a SweepRequest; nothing here reads a
// flag.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipelines/shard.hpp"
#include "sweep/sweep.hpp"

namespace kvcheck::pipelines {

/// Where the outputs of a whole sweep go: a file name, or "-" for stdout
/// (at most one of them; cli/ refuses more and empty names). With none on
/// stdout the table goes there.
struct SweepOutputFiles {
  std::optional<std::string> json;
  std::optional<std::string> csv;
  std::optional<std::string> svg;
};

/// What `kvcheck sweep` was asked for.
struct SweepRequest {
  sweep::SweepGrid grid;
  sweep::SweepOptions options;  ///< with options.shard_index/shard_count for a shard
  bool shard = false;           ///< --shard: write the shard document, not the outputs
  SweepOutputFiles outputs;     ///< unused for a shard (its outputs go to `kvcheck merge`)
};

/// Runs the sweep. A shard makes options.out_dir first (a bad one is exit 2
/// before any work), then writes its shard document there and prints one
/// line; exit 0. A whole sweep writes its outputs (write_sweep_outputs).
int run_capacity_sweep(const SweepRequest& request);

/// The sweep of a whole run from its shard documents (ordered by
/// pipelines::order_shards), its counterexample files moved into `out_dir`.
sweep::SweepResult merge_sweep(const std::vector<pipelines::ShardResult>& shards,
                               const std::filesystem::path& out_dir);

/// Writes a finished sweep's outputs and its summary on stderr; `workers`
/// says what ran it ("2 threads", "3 shards"). Returns 1 when the formula is
/// unsafe somewhere, a counterexample did not replay, or a configuration
/// loses rows at every capacity tried; else 0.
int write_sweep_outputs(const sweep::SweepResult& result, const SweepOutputFiles& outputs, double seconds,
                        const std::string& workers);

}  // namespace kvcheck::pipelines
