// Shard results: what one process of a split run hands to the merge. A run of
// `kvcheck check` or `kvcheck sweep` can be spread over processes and
// machines (`--shard I/N` under a CI matrix, a Slurm or Kubernetes job array,
// or one MPI rank each); every shard writes one small self-describing JSON
// document (`SHARD_DIR/shard.json`, or a message to MPI rank 0) and
// `kvcheck merge` joins them into the report of the whole run, byte for byte
// the report one process writes.
//
// A shard document holds a header (kind, tool version, shard index and
// count), the options that must be equal in every shard of one run (the
// seed, the case count, the cache, the command line apart from --shard,
// --out and --threads), and the kind's own findings: a check shard its
// CaseTally, a sweep shard its rows (pipelines/sweep_shard.hpp). A set
// of shards that is not exactly one whole run (missing, duplicated, of
// another kind, version or options) is refused with ErrorId::kShard naming
// the shard.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "properties/check.hpp"

namespace kvcheck::pipelines {

/// Version of the shard document layout.
inline constexpr int kShardVersion = 1;
/// The shard document's name inside a shard directory.
inline constexpr const char* kShardFileName = "shard.json";

/// One parsed shard document.
struct ShardResult {
  std::string kind;           ///< "check" or "sweep"
  std::string tool_version;   ///< kvcheck version that wrote it
  std::int64_t index = 0;     ///< 0 .. count - 1
  std::int64_t count = 1;     ///< shards of the whole run
  nlohmann::json options;     ///< equal in every shard of one run
  nlohmann::json result;      ///< the kind's findings
  std::string origin;         ///< where it came from, for errors: "DIR/shard.json", "rank R"
  std::filesystem::path dir;  ///< its shard directory (files it refers to lie there); empty for MPI
};

/// The shard document as JSON text (fixed key order, 2-space indent,
/// trailing newline). `options` and `result` are the kind's own objects.
std::string shard_text(std::string_view kind, const std::string& tool_version, std::int64_t index,
                       std::int64_t count, const nlohmann::ordered_json& options,
                       const nlohmann::ordered_json& result);

/// Parses a shard document strictly (unknown keys, wrong types, a version
/// other than kShardVersion are errors); every error names `origin`.
ShardResult parse_shard(std::string_view text, const std::string& origin);

/// Reads and parses DIR/shard.json; a missing or unreadable file is
/// ErrorId::kShard naming it.
ShardResult read_shard_dir(const std::filesystem::path& dir);

/// Checks that `shards` are exactly the shards 0 .. N-1 of one run (one kind,
/// one tool version, one count, equal options) and returns them ordered by
/// index. Throws kvcheck::Error(kShard) naming the first shard at fault:
/// "shard 2/3" when it is missing, its origin otherwise.
std::vector<ShardResult> order_shards(std::vector<ShardResult> shards);

/// "shard I/N", for messages about a shard that has no origin (a missing one).
std::string shard_name(std::int64_t index, std::int64_t count);

// ---- check shards ---------------------------------------------------------------

/// The most cases one check run has (`kvcheck check --cases`' range).
inline constexpr std::int64_t kMaxCheckCases = 100000000;

/// The options of a check run that every shard must share (plain values: the
/// CLI translates them from and to properties::CheckOptions).
struct CheckShardOptions {
  std::string impl;        ///< --impl
  std::string fault;       ///< --fault name
  std::int64_t cases = 0;  ///< cases of the whole run
  std::uint64_t seed = 0;
  int precision_requested = 113;  ///< --precision as given (53, 113, 169); reports record its real bits too
  double step_timeout_seconds = 10.0;
  std::string command;              ///< the report's command line (without --shard, --out, --threads)
  std::string profile = "default";  ///< --profile; written only when not "default"
  double min_run_share = 0.8;       ///< --min-run-share; written only when not the default
  std::optional<std::uint64_t> case_seed;  ///< --case-seed; written only when given
  bool coverage_gate = true;               ///< false: --no-coverage-gate (or --case-seed); written only then
};

nlohmann::ordered_json check_options_json(const CheckShardOptions& options);
/// The options of a check shard, read strictly; a value no `kvcheck check`
/// run can have (cases outside 1..kMaxCheckCases, a seed above 2^63-1, a
/// precision other than 53, 113 and 169, a step timeout outside (0, 86400],
/// an unknown cache name) is ErrorId::kShard naming the shard and field.
CheckShardOptions check_options_from_json(const ShardResult& shard);

nlohmann::ordered_json tally_json(const properties::CaseTally& tally);
/// The tally of a check shard, checked against its shard: it ran exactly the
/// cases index ≡ I (mod N) of the options' case count, and its first failing
/// case is one of them; `classes` is the number of the profile's coverage
/// classes (the document's `kernel_paths`, the cache's own, come after). A count
/// no run can have (negative, above what it counts among: a coverage count
/// above the cases that ran) is ErrorId::kShard naming the shard and field.
properties::CaseTally tally_from_json(const ShardResult& shard, std::int64_t cases, std::size_t classes);

}  // namespace kvcheck::pipelines
