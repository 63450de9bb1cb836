// Shard documents: writing, strict reading, and the checks that a set of
// shards is exactly one whole run.
#include "pipelines/shard.hpp"

#include <algorithm>
#include <map>

#include "scenarios/json_read.hpp"
#include "support/error.hpp"

namespace kvcheck::pipelines {

namespace {

namespace jr = scenarios::json_read;
using Json = nlohmann::ordered_json;

/// Runs `read`, prefixing any kvcheck::Error's location with `origin`, so
/// every message names the shard it is about.
template <typename F>
auto naming(const std::string& origin, F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const Error& e) {
    if (e.id() == ErrorId::kShard) throw;
    throw Error(e.id(), origin + ": " + e.where(), e.rule());
  }
}

/// As naming(), and a value no run can have (ErrorId::kJsonValue: a count
/// out of range, a precision kvcheck does not have) is refused as a shard
/// that is not one of a real run (ErrorId::kShard), naming shard and field.
template <typename F>
auto naming_values(const std::string& origin, F&& read) -> decltype(read()) {
  try {
    return naming(origin, read);
  } catch (const Error& e) {
    if (e.id() == ErrorId::kJsonValue) throw Error(ErrorId::kShard, e.where(), e.rule());
    throw;
  }
}

/// The first key whose value differs between two option objects, "" when
/// equal. The command line is compared last: it differs whenever an option
/// does, and the option itself is the better message.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::string> keys;
  for (const auto* object : {&a, &b}) {
    for (auto it = object->begin(); it != object->end(); ++it) keys.push_back(it.key());
  }
  std::stable_partition(keys.begin(), keys.end(), [](const std::string& k) { return k != "command"; });
  for (const std::string& key : keys) {
    if (!a.contains(key) || !b.contains(key) || a.at(key) != b.at(key)) return key;
  }
  return "";
}

std::string value_text(const nlohmann::json& object, const std::string& key) {
  return object.contains(key) ? object.at(key).dump() : std::string("absent");
}

}  // namespace

std::string shard_name(std::int64_t index, std::int64_t count) {
  return "shard " + std::to_string(index) + "/" + std::to_string(count);
}

std::string shard_text(std::string_view kind, const std::string& tool_version, std::int64_t index,
                       std::int64_t count, const Json& options, const Json& result) {
  Json j;
  j["kvcheck_shard"] = kShardVersion;
  j["name"] = std::string(kind) + " " + shard_name(index, count);
  j["description"] = "One shard of a kvcheck " + std::string(kind) +
                     " run: join every shard with `kvcheck merge SHARD_DIR...`";
  j["kind"] = kind;
  j["tool_version"] = tool_version;
  j["shard"] = Json{{"index", index}, {"count", count}};
  j["options"] = options;
  j["result"] = result;
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

ShardResult parse_shard(std::string_view text, const std::string& origin) {
  return naming(origin, [&] {
    const nlohmann::json doc = jr::parse_document(text, false);
    jr::as_object(doc, "");
    jr::check_keys(
        doc, "",
        {"kvcheck_shard", "name", "description", "kind", "tool_version", "shard", "options", "result"},
        "a shard document");
    const std::int64_t version = jr::get_i64(jr::require(doc, "", "kvcheck_shard"), "kvcheck_shard");
    if (version != kShardVersion) {
      jr::fail(ErrorId::kJsonValue, "kvcheck_shard",
               "shard document version " + std::to_string(version) + ", this kvcheck reads " +
                   std::to_string(kShardVersion));
    }
    ShardResult s;
    s.origin = origin;
    jr::get_string(jr::require(doc, "", "name"), "name");
    jr::get_string(jr::require(doc, "", "description"), "description");
    s.kind = jr::get_string(jr::require(doc, "", "kind"), "kind");
    if (s.kind != "check" && s.kind != "sweep") {
      jr::fail(ErrorId::kJsonValue, "kind", "expected 'check' or 'sweep', got '" + s.kind + "'");
    }
    s.tool_version = jr::get_string(jr::require(doc, "", "tool_version"), "tool_version");
    const auto& shard = jr::as_object(jr::require(doc, "", "shard"), "shard");
    jr::check_keys(shard, "shard", {"index", "count"});
    s.count = jr::get_i64(jr::require(shard, "shard", "count"), "shard.count");
    s.index = jr::get_i64(jr::require(shard, "shard", "index"), "shard.index");
    if (s.count < 1 || s.index < 0 || s.index >= s.count) {
      jr::fail(ErrorId::kJsonValue, "shard",
               "index " + std::to_string(s.index) + " of " + std::to_string(s.count) +
                   " shards (needs 0 <= index < count)");
    }
    s.options = jr::as_object(jr::require(doc, "", "options"), "options");
    s.result = jr::as_object(jr::require(doc, "", "result"), "result");
    return s;
  });
}

ShardResult read_shard_dir(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / kShardFileName;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    throw Error(ErrorId::kShard, file.string(),
                "no shard result here (the shard did not finish, or this is not a shard directory)");
  }
  ShardResult s = parse_shard(jr::read_input_file(file, "a shard result"), file.string());
  s.dir = dir;
  return s;
}

std::vector<ShardResult> order_shards(std::vector<ShardResult> shards) {
  if (shards.empty()) throw Error(ErrorId::kShard, "SHARD_DIR", "no shards given");
  const ShardResult& first = shards.front();
  for (const ShardResult& s : shards) {
    const std::string against = " (" + first.origin + " has ";
    if (s.kind != first.kind) {
      throw Error(ErrorId::kShard, s.origin,
                  "a " + s.kind + " shard, but " + first.origin + " is a " + first.kind + " shard");
    }
    if (s.tool_version != first.tool_version) {
      throw Error(ErrorId::kShard, s.origin,
                  "written by kvcheck " + s.tool_version + against + first.tool_version + ")");
    }
    if (s.count != first.count) {
      throw Error(
          ErrorId::kShard, s.origin,
          "one of " + std::to_string(s.count) + " shards" + against + std::to_string(first.count) + ")");
    }
    if (const std::string key = first_difference(s.options, first.options); !key.empty()) {
      throw Error(ErrorId::kShard, s.origin,
                  "options." + key + " is " + value_text(s.options, key) + against +
                      value_text(first.options, key) + "): not a shard of the same run");
    }
  }
  std::map<std::int64_t, const ShardResult*> by_index;
  for (const ShardResult& s : shards) {
    const auto [it, fresh] = by_index.emplace(s.index, &s);
    if (!fresh) {
      throw Error(ErrorId::kShard, s.origin,
                  shard_name(s.index, s.count) + " given twice (also " + it->second->origin + ")");
    }
  }
  for (std::int64_t i = 0; i < first.count; ++i) {
    if (!by_index.count(i)) {
      throw Error(ErrorId::kShard, shard_name(i, first.count),
                  "missing: " + std::to_string(shards.size()) + " of " + std::to_string(first.count) +
                      " shards given, and none of them is this one");
    }
  }
  std::sort(shards.begin(), shards.end(),
            [](const ShardResult& a, const ShardResult& b) { return a.index < b.index; });
  return shards;
}

// ---- check shards ---------------------------------------------------------------

Json check_options_json(const CheckShardOptions& o) {
  Json j;
  j["impl"] = o.impl;
  j["fault"] = o.fault;
  j["cases"] = o.cases;
  j["seed"] = o.seed;
  j["precision_requested"] = o.precision_requested;
  j["step_timeout_seconds"] = o.step_timeout_seconds;
  j["command"] = o.command;
  if (o.profile != "default") j["profile"] = o.profile;
  if (o.min_run_share != CheckShardOptions{}.min_run_share) j["min_run_share"] = o.min_run_share;
  if (o.case_seed) j["case_seed"] = *o.case_seed;
  if (!o.coverage_gate) j["coverage_gate"] = false;
  return j;
}

CheckShardOptions check_options_from_json(const ShardResult& shard) {
  return naming_values(shard.origin, [&] {
    const auto& j = shard.options;
    jr::check_keys(j, "options",
                   {"impl", "fault", "cases", "seed", "precision_requested", "step_timeout_seconds",
                    "command", "profile", "min_run_share", "case_seed", "coverage_gate"});
    CheckShardOptions o;
    o.impl = jr::get_string(jr::require(j, "options", "impl"), "options.impl");
    o.fault = jr::get_string(jr::require(j, "options", "fault"), "options.fault");
    o.cases = jr::get_i64(jr::require(j, "options", "cases"), "options.cases");
    // The ranges of the flags `kvcheck check` takes: a shard outside them
    // was not written by a run.
    if (o.cases < 1 || o.cases > kMaxCheckCases) {
      jr::fail(ErrorId::kJsonValue, "options.cases", "must be in 1.." + std::to_string(kMaxCheckCases));
    }
    if (o.impl != "cpu" && o.impl != "cuda" && o.impl != "paged" && o.impl != "layer" &&
        !(o.impl.rfind("exec:", 0) == 0 && o.impl.size() > 5)) {
      jr::fail(ErrorId::kJsonValue, "options.impl",
               "is not a cache kvcheck has (cpu, cuda, paged, layer, exec:COMMAND)");
    }
    o.seed = jr::get_u64(jr::require(j, "options", "seed"), "options.seed");
    if (o.seed > static_cast<std::uint64_t>(INT64_MAX)) {
      jr::fail(ErrorId::kJsonValue, "options.seed", "must be in 0..2^63-1, as --seed takes");
    }
    o.precision_requested =
        jr::get_i32(jr::require(j, "options", "precision_requested"), "options.precision_requested");
    if (o.precision_requested != 53 && o.precision_requested != 113 && o.precision_requested != 169) {
      jr::fail(
          ErrorId::kJsonValue, "options.precision_requested",
          "is " + std::to_string(o.precision_requested) + " bits: kvcheck's precisions are 53, 113 and 169");
    }
    o.step_timeout_seconds =
        jr::get_f64(jr::require(j, "options", "step_timeout_seconds"), "options.step_timeout_seconds");
    if (!(o.step_timeout_seconds > 0 && o.step_timeout_seconds <= 86400)) {
      jr::fail(ErrorId::kJsonValue, "options.step_timeout_seconds", "must be in (0, 86400] seconds");
    }
    o.command = jr::get_string(jr::require(j, "options", "command"), "options.command");
    if (const auto* p = jr::find(j, "profile")) o.profile = jr::get_string(*p, "options.profile");
    if (const auto* p = jr::find(j, "min_run_share")) {
      o.min_run_share = jr::get_f64(*p, "options.min_run_share");
      if (!(o.min_run_share >= 0 && o.min_run_share <= 1))
        jr::fail(ErrorId::kJsonValue, "options.min_run_share", "must be in 0..1");
    }
    if (const auto* p = jr::find(j, "case_seed")) o.case_seed = jr::get_u64(*p, "options.case_seed");
    if (const auto* p = jr::find(j, "coverage_gate")) o.coverage_gate = jr::get_bool(*p, "options.coverage_gate");
    return o;
  });
}

Json tally_json(const properties::CaseTally& t) {
  Json j;
  j["cases"] = t.cases;
  j["failures"] = t.failures;
  j["skipped"] = t.skipped;
  j["refused"] = t.refused;
  j["queries"] = t.queries;
  j["queries_not_output_checked"] = t.queries_not_output_checked;
  j["coverage_counts"] = t.coverage_counts;
  j["reachable"] = t.reachable;
  // Cases drawn with a class that the cache refused or that were skipped
  // (optional: only where some were).
  if (std::any_of(t.coverage_refused.begin(), t.coverage_refused.end(), [](std::int64_t n) { return n > 0; }))
    j["coverage_refused"] = t.coverage_refused;
  // The cache's own kernel paths, the last classes (optional: caches that
  // declare none, and older documents, have none).
  if (!t.kernel_paths.empty()) j["kernel_paths"] = t.kernel_paths;
  if (t.block_size > 0) {
    // A paged cache's block frees and reuses (optional: older documents lack them).
    j["block_size"] = t.block_size;
    j["block_window_frees"] = t.block_window_frees;
    j["block_end_frees"] = t.block_end_frees;
    j["block_reuses"] = t.block_reuses;
  }
  j["first_failing_case"] = t.first_failing_case < 0 ? Json(nullptr) : Json(t.first_failing_case);
  // Optional (older documents lack them): every failing case (the lowest
  // kListedFailingCases), and what the cache makes available.
  j["failing_cases"] = t.failing_cases;
  j["observed"] = t.observed;
  return j;
}

properties::CaseTally tally_from_json(const ShardResult& shard, std::int64_t cases, std::size_t classes) {
  return naming_values(shard.origin, [&] {
    const auto& j = shard.result;
    jr::check_keys(j, "result",
                   {"cases", "failures", "skipped", "refused", "queries", "queries_not_output_checked",
                    "coverage_counts", "reachable", "coverage_refused", "first_failing_case", "block_size",
                    "block_window_frees", "block_end_frees", "block_reuses", "kernel_paths", "failing_cases",
                    "observed"});
    properties::CaseTally t;
    if (const auto* v = jr::find(j, "kernel_paths")) {
      const auto& names = jr::as_array(*v, "result.kernel_paths");
      for (std::size_t k = 0; k < names.size(); ++k)
        t.kernel_paths.push_back(jr::get_string(names[k], jr::join_index("result.kernel_paths", k)));
    }
    classes += t.kernel_paths.size();  // counted after the profile's own
    for (auto [key, into] : {std::pair<const char*, std::int64_t*>{"block_size", &t.block_size},
                             {"block_window_frees", &t.block_window_frees},
                             {"block_end_frees", &t.block_end_frees},
                             {"block_reuses", &t.block_reuses}}) {
      if (const auto* v = jr::find(j, key)) {
        *into = jr::get_i64(*v, std::string("result.") + key);
        if (*into < 0) jr::fail(ErrorId::kJsonValue, std::string("result.") + key, "must be at least 0");
      }
    }
    t.cases = jr::get_i64(jr::require(j, "result", "cases"), "result.cases");
    const std::int64_t expected =
        shard.index < cases ? (cases - shard.index + shard.count - 1) / shard.count : 0;
    if (t.cases != expected) {
      jr::fail(ErrorId::kJsonValue, "result.cases",
               std::to_string(t.cases) + " cases run, but " + shard_name(shard.index, shard.count) + " of " +
                   std::to_string(cases) + " has " + std::to_string(expected));
    }
    t.failures = jr::get_i64(jr::require(j, "result", "failures"), "result.failures");
    t.skipped = jr::get_i64(jr::require(j, "result", "skipped"), "result.skipped");
    if (t.failures < 0 || t.failures > t.cases)
      jr::fail(ErrorId::kJsonValue, "result.failures", "must be in 0..cases");
    if (t.skipped < 0 || t.skipped > t.cases)
      jr::fail(ErrorId::kJsonValue, "result.skipped", "must be in 0..cases");
    t.refused = jr::get_i64(jr::require(j, "result", "refused"), "result.refused");
    if (t.refused < 0 || t.refused > t.cases - t.skipped)
      jr::fail(ErrorId::kJsonValue, "result.refused", "must be in 0..cases - skipped");
    t.queries = jr::get_i64(jr::require(j, "result", "queries"), "result.queries");
    t.queries_not_output_checked = jr::get_i64(jr::require(j, "result", "queries_not_output_checked"),
                                               "result.queries_not_output_checked");
    if (t.queries < 0) jr::fail(ErrorId::kJsonValue, "result.queries", "must be at least 0");
    if (t.queries_not_output_checked < 0 || t.queries_not_output_checked > t.queries)
      jr::fail(ErrorId::kJsonValue, "result.queries_not_output_checked", "must be in 0..queries");
    const auto& counts = jr::as_array(jr::require(j, "result", "coverage_counts"), "result.coverage_counts");
    const auto& reachable = jr::as_array(jr::require(j, "result", "reachable"), "result.reachable");
    if (counts.size() != classes || reachable.size() != classes) {
      jr::fail(ErrorId::kJsonValue, "result.coverage_counts",
               "expected " + std::to_string(classes) + " coverage classes in coverage_counts and reachable");
    }
    // A class is counted once per case that ran (neither skipped nor refused).
    const std::int64_t ran = t.cases - t.skipped - t.refused;
    for (std::size_t k = 0; k < classes; ++k) {
      const std::string field = jr::join_index("result.coverage_counts", k);
      t.coverage_counts.push_back(jr::get_i64(counts[k], field));
      if (t.coverage_counts.back() < 0 || t.coverage_counts.back() > ran) {
        jr::fail(ErrorId::kJsonValue, field,
                 std::to_string(t.coverage_counts.back()) + " cases, but the shard ran " +
                     std::to_string(ran) + " (cases - skipped - refused)");
      }
      t.reachable.push_back(jr::get_bool(reachable[k], jr::join_index("result.reachable", k)));
    }
    if (const auto* refused = jr::find(j, "coverage_refused")) {
      t.coverage_refused.assign(classes, 0);
      const auto& list = jr::as_array(*refused, "result.coverage_refused");
      if (list.size() != classes) {
        jr::fail(ErrorId::kJsonValue, "result.coverage_refused",
                 "expected " + std::to_string(classes) + " coverage classes");
      }
      // A class is counted once per case that did not run.
      for (std::size_t k = 0; k < classes; ++k) {
        const std::string field = jr::join_index("result.coverage_refused", k);
        t.coverage_refused[k] = jr::get_i64(list[k], field);
        if (t.coverage_refused[k] < 0 || t.coverage_refused[k] > t.skipped + t.refused)
          jr::fail(ErrorId::kJsonValue, field, "must be in 0..skipped + refused");
      }
    }
    const auto& first = jr::require(j, "result", "first_failing_case");
    if (!first.is_null()) {
      t.first_failing_case = jr::get_i64(first, "result.first_failing_case");
      if (t.first_failing_case < 0 || t.first_failing_case >= cases ||
          t.first_failing_case % shard.count != shard.index) {
        jr::fail(ErrorId::kJsonValue, "result.first_failing_case",
                 "case " + std::to_string(t.first_failing_case) + " is not one of this shard's cases");
      }
    }
    if ((t.failures > 0) != (t.first_failing_case >= 0)) {
      jr::fail(ErrorId::kJsonValue, "result.first_failing_case", "must be given exactly when failures > 0");
    }
    if (const auto* v = jr::find(j, "failing_cases")) {
      const auto& listed = jr::as_array(*v, "result.failing_cases");
      for (std::size_t k = 0; k < listed.size(); ++k) {
        const std::string field = jr::join_index("result.failing_cases", k);
        const std::int64_t i = jr::get_i64(listed[k], field);
        if (i < 0 || i >= cases || i % shard.count != shard.index || (k > 0 && i <= t.failing_cases.back()))
          jr::fail(ErrorId::kJsonValue, field, "case " + std::to_string(i) + " is not one of this shard's cases in ascending order");
        t.failing_cases.push_back(i);
      }
      if (static_cast<std::int64_t>(t.failing_cases.size()) > t.failures ||
          t.failing_cases.size() > properties::kListedFailingCases ||
          (!t.failing_cases.empty() && t.failing_cases.front() != t.first_failing_case))
        jr::fail(ErrorId::kJsonValue, "result.failing_cases",
                 "must list the lowest failing cases, first_failing_case first, at most failures of them");
    }
    // An older document (or none listed): the one failing case it names.
    if (t.failing_cases.empty() && t.first_failing_case >= 0) t.failing_cases.push_back(t.first_failing_case);
    if (const auto* v = jr::find(j, "observed")) t.observed = jr::get_string(*v, "result.observed");
    return t;
  });
}

}  // namespace kvcheck::pipelines
