// Sweep shards (`kvcheck sweep --shard I/N`, joined by `kvcheck merge`): the
// options every shard of one sweep shares, the rows one shard computed, and
// the merge back into the SweepResult one process computes. A shard owns the
// (drafts, chunk, order) columns u ≡ I (mod N) over all windows
// (sweep_row_in_shard), so every row is searched exactly as in one process.
// The shard document's envelope is pipelines/shard.hpp; counterexample files
// stay in the shard directory (named by file name in the shard document) until
// the merge copies them into its --out.
#pragma once

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipelines/shard.hpp"
#include "sweep/sweep.hpp"

namespace kvcheck::pipelines {

/// The options of a sweep that every shard must share: the grid, states,
/// the cache, the formula and the counterexample mode.
nlohmann::ordered_json sweep_shard_options_json(const sweep::SweepGrid& grid,
                                                const sweep::SweepOptions& options);

/// The rows of shard (index, count) of `result`, as the shard document's result.
nlohmann::ordered_json sweep_shard_rows_json(const sweep::SweepResult& result, std::int64_t index,
                                             std::int64_t count);

/// The sweep of the whole run from its shards (ordered by
/// pipelines::order_shards): grid, states and formula from the options, every
/// row from the shard that owns it, totals recomputed. A row's
/// counterexample is the file in its shard's directory. Throws
/// kvcheck::Error naming the shard for a malformed document or a shard that
/// does not hold exactly its own rows.
sweep::SweepResult merge_sweep_shards(const std::vector<ShardResult>& shards);

/// Moves the counterexample files of `result` into `out_dir` (each written
/// atomically under its own file name) and points the rows at them. Every
/// file is read before the first is written, so a missing one changes nothing.
void adopt_counterexamples(sweep::SweepResult& result, const std::filesystem::path& out_dir);

}  // namespace kvcheck::pipelines
