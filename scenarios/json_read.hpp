// Strict JSON reading shared by the scenario format (scenario_read.cpp) and
// the trace format (trace_json.cpp): a SAX-built document that rejects
// duplicate keys, non-finite numbers and deep nesting with their JSON path,
// and typed reads that name the path and what was expected. Every failure is
// a kvcheck::Error. Internal to scenarios/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "scenarios/scenario.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

namespace kvcheck::scenarios::json_read {

using json = nlohmann::json;

/// "path.key" ("key" at the root) and "path[index]".
std::string join_key(const std::string& path, std::string_view key);
std::string join_index(const std::string& path, std::size_t index);

[[noreturn]] void fail(ErrorId id, std::string where, const std::string& rule);

/// Parses one JSON text strictly (duplicate keys, depth beyond kMaxJsonDepth,
/// non-finite numbers, syntax errors at "byte N"). `one_line`: the text is a
/// single JSON Lines record, so nlohmann's "line 1, " is dropped from syntax
/// errors (the caller names the line).
json parse_document(std::string_view text, bool one_line);

/// "an integer", "a string", ... for type errors.
std::string describe(const json& j);
[[noreturn]] void type_error(const json& j, const std::string& path, std::string_view expected);

const json& as_object(const json& j, const std::string& path);
const json& as_array(const json& j, const std::string& path);
/// Every key of `object` is in `allowed`; `owner` names who the keys belong to.
void check_keys(const json& object, const std::string& path, const std::vector<std::string_view>& allowed,
                std::string_view owner = "");
const json* find(const json& object, std::string_view key);
const json& require(const json& object, const std::string& path, std::string_view key,
                    std::string_view owner = "");

std::int64_t get_i64(const json& j, const std::string& path);
std::int32_t get_i32(const json& j, const std::string& path);
std::uint64_t get_u64(const json& j, const std::string& path);
double get_f64(const json& j, const std::string& path);
std::optional<double> get_optional_f64(const json& j, const std::string& path);
bool get_bool(const json& j, const std::string& path);
std::string get_string(const json& j, const std::string& path);
std::vector<double> get_f64_array(const json& j, const std::string& path);
/// Finite, and |value| <= kMaxMagnitude.
void check_real(double value, const std::string& path);

/// The whole of a file of at most kMaxFileBytes, for a parser; `what` names
/// it in errors ("a scenario file"). Throws kIo / kSize naming the path.
std::string read_input_file(const std::filesystem::path& path, std::string_view what);

/// Files and directories expanded into a sorted, duplicate-free list: a file
/// argument as given, a directory every regular file below it (recursively)
/// that `wanted` accepts. Throws kIo for a path that does not exist or cannot
/// be listed.
std::vector<std::filesystem::path> collect_files(
    const std::vector<std::string>& files_or_dirs,
    const std::function<bool(const std::filesystem::path&)>& wanted);

/// One of `values`, by `name`.
template <typename E, std::size_t N>
E get_enum(const json& j, const std::string& path, const E (&values)[N],
           std::string_view (*name)(E) noexcept) {
  const std::string text = get_string(j, path);
  std::string choices;
  for (E value : values) {
    if (name(value) == text) return value;
    choices += (choices.empty() ? "'" : ", '") + std::string(name(value)) + "'";
  }
  fail(ErrorId::kJsonValue, path, "unknown name '" + text + "' (one of " + choices + ")");
}

// Formats: kElementFormats in support/formats.hpp, from the table of formats.
inline constexpr Convention kConventions[] = {Convention::kKeys, Convention::kLeft, Convention::kOffByOne};
inline constexpr RopeStyle kRopeStyles[] = {RopeStyle::kNone, RopeStyle::kNeox, RopeStyle::kInterleaved};
inline constexpr ValueProfile kValueProfiles[] = {ValueProfile::kUniform, ValueProfile::kLargeLogits,
                                                  ValueProfile::kFp8Outliers, ValueProfile::kPositionCode};
inline constexpr Order kOrders[] = {Order::kLoadThenStore, Order::kStoreThenLoad};
// kStepKinds: scenarios/step_kinds.hpp, from the table of step kinds.

}  // namespace kvcheck::scenarios::json_read
