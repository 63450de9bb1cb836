// `kvcheck merge SHARD_DIR...`: the shard documents of a split run joined
// into the report of the whole run.
//
// A shard document may come from anywhere (a CI artifact anyone could edit),
// so merge trusts none of it: it never runs a command that came from a file
// (an exec: engine to re-run failing cases on is merge's own --impl, which
// must equal the shards' recorded engine; a built-in cache's name, which
// runs nothing from a file, is taken from the shards); every recorded option is read back
// from the shard's recorded command line exactly as `kvcheck check` reads its
// flags and must agree with it; and impossible tallies are refused
// (pipelines/shard.hpp, pipelines::merge_check). Every refusal is
// kvcheck::Error(kShard) naming the shard and the field.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/usage.hpp"
#include "engines/factory.hpp"
#include "pipelines/catalog.hpp"
#include "pipelines/check.hpp"
#include "pipelines/sweep.hpp"
#include "properties/check.hpp"
#include "properties/memory_estimate.hpp"
#include "properties/option_table.hpp"
#include "pipelines/shard.hpp"
#include "support/error.hpp"

namespace kvcheck::cli {

namespace {

namespace fs = std::filesystem;

/// `text` split at every single space (the recorded command line joins its
/// arguments with one space each, unquoted).
std::vector<std::string> split_spaces(const std::string& text) {
  std::vector<std::string> out(1);
  for (const char c : text) {
    if (c == ' ') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

[[noreturn]] void refuse(const pipelines::ShardResult& shard, const std::string& field,
                         const std::string& why) {
  throw Error(ErrorId::kShard, shard.origin + ": " + field, why);
}

/// Reads the shard's recorded command line (`options.command`) back with
/// `kvcheck check`'s own flag reader and refuses the shard when an option it
/// records disagrees with it. The engine's command may contain spaces (the
/// recording does not quote), so the words after --impl are taken as the
/// recorded engine where they spell it, and the engine is then compared like
/// every other option.
void cross_check_command(const pipelines::ShardResult& shard) {
  const pipelines::CheckShardOptions o = pipelines::check_options_from_json(shard);
  const std::vector<std::string> words = split_spaces(o.command);
  if (words.size() < 2 || words[0] != "kvcheck" || words[1] != "check") {
    refuse(shard, "options.command", "is not a `kvcheck check` command line");
  }
  const std::size_t impl_words = split_spaces(o.impl).size();
  std::vector<std::string> argv_text = {"kvcheck", "check"};
  for (std::size_t i = 2; i < words.size(); ++i) {
    const std::string& w = words[i];
    const bool split_form = w == "--impl";
    if (!split_form && w.rfind("--impl=", 0) != 0) {
      argv_text.push_back(w);
      continue;
    }
    // "--impl VALUE..." or "--impl=VALUE...": VALUE spans impl_words words.
    const std::size_t first = split_form ? i + 1 : i;
    if (first + impl_words > words.size()) {
      refuse(shard, "options.impl", "is not the engine its recorded command line names after --impl");
    }
    std::string value = split_form ? words[first] : words[first].substr(7);
    for (std::size_t j = first + 1; j < first + impl_words; ++j) value += " " + words[j];
    if (value != o.impl) {
      refuse(shard, "options.impl", "is not the engine its recorded command line names after --impl");
    }
    argv_text.push_back("--impl");
    argv_text.push_back(value);
    i = first + impl_words - 1;
  }
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  // What the shard records, as a check's options: each option with a field
  // in the shard document (properties/option_table.hpp) must read back from
  // the command line as the same value.
  const properties::CheckOptions recorded = pipelines::check_options_of(shard);
  try {
    // The flags a check's command line records (--out, --threads, --shard
    // and --reference never change a result and are not recorded).
    const Args args(static_cast<int>(argv.size()), argv.data(), 2,
                    properties::option_flags(properties::kForCheck | properties::kRecorded, false),
                    properties::option_flags(properties::kForCheck | properties::kRecorded, true));
    args.no_positional("check");
    if (args.has("--record")) {
      refuse(shard, "options.command", "holds --record, which a shard's run never takes");
    }
    const properties::CheckOptions given = read_check_options(args, false);
    for (const properties::OptionRow& row : properties::kCheckOptions) {
      if (row.shard_key.empty()) continue;
      const auto recorded_text = properties::option_text(row.id, recorded);
      const auto given_text = properties::option_text(row.id, given);
      if (recorded_text != given_text) {
        refuse(shard, "options." + std::string(row.shard_key),
               "is " + recorded_text.value_or("(none)") + ", but its recorded command line gives " +
                   std::string(row.flag) + " " + given_text.value_or("(none)") +
                   ": the shard document does not describe the run it claims");
      }
    }
  } catch (const Error& e) {
    if (e.id() == ErrorId::kShard) throw;
    refuse(shard, "options.command",
           std::string("does not read as a `kvcheck check` command line: ") + e.what());
  }
}

/// --impl of merge: the engine failing cases are re-run on.
std::string merge_impl_flag(const std::string& name) {
  if (name == "cpu" || name == "cuda" || name == "paged" || name == "layer" ||
      (engines::is_exec(name) && name != "exec:")) {
    return name;
  }
  throw Error(
      ErrorId::kUsage, "--impl",
      "unknown cache '" + name + "' (cpu, cuda, paged, layer, or exec:'COMMAND ARGS': the engine the shards ran)");
}

}  // namespace

int command_merge(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  Args args = command_args(argc, argv, "merge");
  if (args.positional().empty())
    throw Error(ErrorId::kUsage, "SHARD_DIR", "merge needs the shard directories");
  // Every shard is read and checked before anything is written.
  std::vector<pipelines::ShardResult> shards;
  for (const auto& dir : args.positional()) shards.push_back(pipelines::read_shard_dir(dir));
  shards = pipelines::order_shards(std::move(shards));
  const std::string workers = std::to_string(shards.size()) + " shards";
  {
    // Refused up front when the merge would not fit: a check's merge shrinks
    // one failing case of its profile, a sweep's keeps every shard's rows.
    std::string limit_source;
    const std::int64_t limit = memory_limit_flag(args, &limit_source);
    properties::MemoryEstimate estimate;
    if (shards.front().kind == "check") {
      properties::Profile profile = properties::Profile::kDefault;
      if (const auto it = shards.front().options.find("profile");
          it != shards.front().options.end() && it->is_string())
        properties::parse_profile(it->get<std::string>(), &profile);
      estimate = properties::estimate_check(profile, 1);
    } else {
      properties::SweepSize size;
      for (const auto& shard : shards) {
        if (const auto it = shard.result.find("rows"); it != shard.result.end() && it->is_array())
          size.configurations += static_cast<double>(it->size());
      }
      size.widest_flag = "SHARD_DIR";
      estimate = properties::estimate_sweep(size);
    }
    properties::require_memory(estimate, limit, limit_source);
  }
  if (shards.front().kind == "check") {
    for (const char* flag : {"--json", "--csv", "--svg"}) {
      if (args.has(flag))
        throw Error(ErrorId::kUsage, flag, "is for sweep shards; a check writes its reports into --out");
    }
    std::optional<std::string> engine;
    if (const auto name = args.get("--impl")) engine = merge_impl_flag(*name);
    for (const auto& shard : shards) cross_check_command(shard);
    // merge_check prepares --out once every shard has been checked (a refused
    // merge leaves --out as it was).
    const fs::path out = args.get_or("--out", "kvcheck-out");
    return pipelines::merge_check(shards, out, workers, start, false, engine);
  }
  if (args.has("--impl")) {
    throw Error(ErrorId::kUsage, "--impl", "is for check shards; a sweep's merge runs nothing");
  }
  const sweep::SweepResult result = pipelines::merge_sweep(shards, args.get_or("--out", "kvcheck-out/sweep"));
  // The order of errors: the shards are read (and their counterexamples moved) before --json is checked.
  const pipelines::SweepOutputFiles outputs = sweep_output_flags(args);
  return pipelines::write_sweep_outputs(result, outputs, pipelines::seconds_since(start), workers);
}

}  // namespace kvcheck::cli
