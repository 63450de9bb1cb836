// Sweep shard documents and their merge.
#include "pipelines/sweep_shard.hpp"

#include <string>
#include <string_view>
#include <utility>

#include "scenarios/json_read.hpp"
#include "support/assert.hpp"
#include "support/atomic_write.hpp"
#include "support/error.hpp"

namespace kvcheck::pipelines {

// The sweep's own types and searches, by their names (this file reads and
// writes its shards).
using namespace kvcheck::sweep;

namespace {

namespace jr = scenarios::json_read;
using Json = nlohmann::ordered_json;

const char* counterexample_mode_name(CounterexampleMode mode) noexcept {
  switch (mode) {
    case CounterexampleMode::kAuto: return "auto";
    case CounterexampleMode::kAll: return "all";
    case CounterexampleMode::kNone: return "none";
  }
  return "auto";
}

std::vector<std::int64_t> int_array(const nlohmann::json& object, const std::string& path,
                                    std::string_view key) {
  const std::string where = jr::join_key(path, key);
  const auto& array = jr::as_array(jr::require(object, path, key), where);
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < array.size(); ++i)
    out.push_back(jr::get_i64(array[i], jr::join_index(where, i)));
  return out;
}

/// The grid, states and formula of a sweep shard's options.
SweepResult frame_from(const pipelines::ShardResult& shard) {
  const auto& o = shard.options;
  jr::check_keys(o, "options",
                 {"grid", "states", "impl", "step_timeout_seconds", "formula", "counterexamples"});
  SweepResult result;
  const auto& grid = jr::as_object(jr::require(o, "options", "grid"), "options.grid");
  jr::check_keys(grid, "options.grid", {"windows", "drafts", "chunks", "orders"});
  result.grid.windows = int_array(grid, "options.grid", "windows");
  result.grid.drafts = int_array(grid, "options.grid", "drafts");
  result.grid.chunks = int_array(grid, "options.grid", "chunks");
  const auto& orders = jr::as_array(jr::require(grid, "options.grid", "orders"), "options.grid.orders");
  for (std::size_t i = 0; i < orders.size(); ++i) {
    const std::string where = jr::join_index("options.grid.orders", i);
    const std::string name = jr::get_string(orders[i], where);
    if (name == order_file_name(SweepOrder::kStoreThenLoad)) {
      result.grid.orders.push_back(SweepOrder::kStoreThenLoad);
    } else if (name == order_file_name(SweepOrder::kLoadThenStore)) {
      result.grid.orders.push_back(SweepOrder::kLoadThenStore);
    } else {
      jr::fail(ErrorId::kJsonValue, where, "unknown prefill order '" + name + "'");
    }
  }
  result.states = jr::get_i64(jr::require(o, "options", "states"), "options.states");
  const auto& formula = jr::require(o, "options", "formula");
  if (!formula.is_null()) result.formula = jr::get_string(formula, "options.formula");
  const std::int64_t total = result.grid.size();
  result.rows.resize(static_cast<std::size_t>(total));
  for (std::int64_t r = 0; r < total; ++r)
    result.rows[static_cast<std::size_t>(r)].config = result.grid.at(r);
  return result;
}

// The fields of a SweepRow in a shard document, by type: one table for the
// writer and the reader, so the two cannot drift apart. (`row` and
// `counterexample` are written and read by hand.)
constexpr std::pair<std::string_view, std::int64_t SweepRow::*> kRowIntegers[] = {
    {"min_safe_ring", &SweepRow::min_safe_ring}, {"probes", &SweepRow::probes},
    {"spec_bound", &SweepRow::spec_bound},       {"seed_ring", &SweepRow::seed_ring},
    {"below_ring", &SweepRow::below_ring},       {"below_collisions", &SweepRow::below_collisions},
    {"formula_ring", &SweepRow::formula_ring},   {"refused_capacities", &SweepRow::refused_capacities}};
constexpr std::pair<std::string_view, bool SweepRow::*> kRowFlags[] = {
    {"spec_agrees", &SweepRow::spec_agrees}, {"has_below", &SweepRow::has_below},
    {"replayed", &SweepRow::replayed},       {"replay_ok", &SweepRow::replay_ok},
    {"has_formula", &SweepRow::has_formula}, {"formula_safe", &SweepRow::formula_safe},
    {"unsupported", &SweepRow::unsupported}};
constexpr std::pair<std::string_view, std::string SweepRow::*> kRowTexts[] = {
    {"below_hazard", &SweepRow::below_hazard},
    {"replay_detail", &SweepRow::replay_detail},
    {"refusal", &SweepRow::refusal}};
constexpr std::pair<std::string_view, std::vector<std::int64_t> SweepRow::*> kRowLists[] = {
    {"below_overwritten", &SweepRow::below_overwritten}, {"below_first_lost", &SweepRow::below_first_lost}};

/// Reads one row object into `row` (its configuration is already set).
void row_from(const nlohmann::json& j, const std::string& path, const std::filesystem::path& dir,
              SweepRow& row) {
  std::vector<std::string_view> keys = {"row", "counterexample"};
  for (const auto& [key, member] : kRowIntegers) {
    keys.push_back(key);
    row.*member = jr::get_i64(jr::require(j, path, key), jr::join_key(path, key));
  }
  for (const auto& [key, member] : kRowFlags) {
    keys.push_back(key);
    row.*member = jr::get_bool(jr::require(j, path, key), jr::join_key(path, key));
  }
  for (const auto& [key, member] : kRowTexts) {
    keys.push_back(key);
    row.*member = jr::get_string(jr::require(j, path, key), jr::join_key(path, key));
  }
  for (const auto& [key, member] : kRowLists) {
    keys.push_back(key);
    row.*member = int_array(j, path, key);
  }
  jr::check_keys(j, path, keys);
  const std::string file =
      jr::get_string(jr::require(j, path, "counterexample"), jr::join_key(path, "counterexample"));
  if (!file.empty()) {
    // A bare file name in the shard's own directory; anything else could
    // make the merge read or overwrite files elsewhere.
    if (file != std::filesystem::path(file).filename().string() || file == "." || file == "..") {
      jr::fail(ErrorId::kJsonValue, jr::join_key(path, "counterexample"),
               "must be a file name, got '" + file + "'");
    }
    row.counterexample = (dir / file).string();
  }
}

}  // namespace

Json sweep_shard_options_json(const SweepGrid& grid, const SweepOptions& options) {
  Json g;
  g["windows"] = grid.windows;
  g["drafts"] = grid.drafts;
  g["chunks"] = grid.chunks;
  Json orders = Json::array();
  for (const SweepOrder o : grid.orders) orders.push_back(order_file_name(o));
  g["orders"] = std::move(orders);
  Json j;
  j["grid"] = std::move(g);
  j["states"] = options.probe.states;
  j["impl"] = options.impl;
  j["step_timeout_seconds"] = options.step_timeout_seconds;
  j["formula"] = options.formula ? Json(options.formula->text()) : Json(nullptr);
  j["counterexamples"] = counterexample_mode_name(options.counterexamples);
  return j;
}

Json sweep_shard_rows_json(const SweepResult& result, std::int64_t index, std::int64_t count) {
  Json rows = Json::array();
  for (std::size_t r = 0; r < result.rows.size(); ++r) {
    if (!sweep_row_in_shard(result.grid, static_cast<std::int64_t>(r), index, count)) continue;
    const SweepRow& row = result.rows[r];
    Json j;
    j["row"] = r;
    for (const auto& [key, member] : kRowIntegers) j[std::string(key)] = row.*member;
    for (const auto& [key, member] : kRowFlags) j[std::string(key)] = row.*member;
    for (const auto& [key, member] : kRowTexts) j[std::string(key)] = row.*member;
    for (const auto& [key, member] : kRowLists) j[std::string(key)] = row.*member;
    j["counterexample"] = row.counterexample.empty()
                              ? std::string()
                              : std::filesystem::path(row.counterexample).filename().string();
    rows.push_back(std::move(j));
  }
  Json out{{"rows", std::move(rows)}};
  // A paged cache's rows are pools in blocks of this many rows (absent for rings).
  if (result.block_size > 0) out["block_size"] = result.block_size;
  return out;
}

SweepResult merge_sweep_shards(const std::vector<ShardResult>& shards) {
  KVCHECK_ASSERT(!shards.empty());
  SweepResult result;
  for (const pipelines::ShardResult& shard : shards) {
    try {
      if (&shard == &shards.front()) result = frame_from(shard);
      jr::check_keys(shard.result, "result", {"rows", "block_size"});
      if (shard.result.contains("block_size"))
        result.block_size = jr::get_i64(shard.result.at("block_size"), "result.block_size");
      const auto& rows = jr::as_array(jr::require(shard.result, "result", "rows"), "result.rows");
      // Exactly this shard's rows, each once, in grid order.
      std::size_t at = 0;
      for (std::int64_t r = 0; r < static_cast<std::int64_t>(result.rows.size()); ++r) {
        if (!sweep_row_in_shard(result.grid, r, shard.index, shard.count)) continue;
        const std::string path = jr::join_index("result.rows", at);
        if (at >= rows.size())
          jr::fail(ErrorId::kJsonValue, "result.rows",
                   "row " + std::to_string(r) + " of this shard is missing");
        const auto& j = jr::as_object(rows[at], path);
        const std::int64_t row = jr::get_i64(jr::require(j, path, "row"), jr::join_key(path, "row"));
        if (row != r) {
          jr::fail(ErrorId::kJsonValue, jr::join_key(path, "row"),
                   "expected row " + std::to_string(r) + " (this shard's rows in grid order), got " +
                       std::to_string(row));
        }
        row_from(j, path, shard.dir, result.rows[static_cast<std::size_t>(r)]);
        ++at;
      }
      if (at != rows.size()) {
        jr::fail(ErrorId::kJsonValue, jr::join_index("result.rows", at), "a row that is not this shard's");
      }
    } catch (const Error& e) {
      throw Error(e.id(), shard.origin + ": " + e.where(), e.rule());
    }
  }
  summarize_sweep(result);
  return result;
}

void adopt_counterexamples(SweepResult& result, const std::filesystem::path& out_dir) {
  std::vector<std::pair<SweepRow*, std::string>> files;
  for (SweepRow& row : result.rows) {
    if (row.counterexample.empty()) continue;
    files.emplace_back(&row, jr::read_input_file(row.counterexample, "a sweep counterexample"));
  }
  if (files.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec || !std::filesystem::is_directory(out_dir)) {
    throw Error(ErrorId::kIo, out_dir.string(),
                "cannot create the counterexample directory: " + ec.message());
  }
  for (auto& [row, content] : files) {
    const std::filesystem::path target = out_dir / std::filesystem::path(row->counterexample).filename();
    write_file_atomic(target, content);
    row->counterexample = target.string();
  }
}

}  // namespace kvcheck::pipelines
