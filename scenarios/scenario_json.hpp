// Scenario files: JSON format version 1 (see scenarios/schema/scenario.schema.json).
//
// Reading turns a document into a validated Scenario or throws one
// kvcheck::Error naming the JSON path at fault (`steps[3].accepted`,
// `cache.ring_rows`). Validation simulates the schedule, so a scenario that
// loads is replayable: every step names a known request, states are never
// shared by two active requests, accepts follow their verify, and no size
// product overflows. Writing is canonical: fixed key order, 2-space indent,
// shortest round-trip doubles, so save(parse(save(s))) == save(s) byte for
// byte and bundled files can be compared with their canonical form.
//
// One job per file: scenario_read.cpp (document -> Scenario),
// scenario_validate.cpp (validation by simulation), scenario_print.cpp
// (canonical text), scenario_names.cpp (enum spellings), scenario_files.cpp
// (load, atomic write, collect).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "scenarios/scenario.hpp"

namespace kvcheck::scenarios {

/// Most rows one prefill step may write.
inline constexpr std::int64_t kMaxPrefillRows = std::int64_t{1} << 20;
/// Most drafts one verify step may carry.
inline constexpr std::int64_t kMaxDrafts = std::int64_t{1} << 20;
/// Exclusive bound on rows written per request over a whole schedule, and on
/// window, ring_rows and states; keeps every position sum far from overflow.
inline constexpr std::int64_t kMaxRows = std::int64_t{1} << 40;
/// Largest magnitude accepted for any real value (row values, RoPE base,
/// scale, sink logit, tolerance): products of two stay finite in f32.
inline constexpr double kMaxMagnitude = 1e18;
/// Deepest JSON nesting accepted (a valid scenario nests 4 levels).
inline constexpr int kMaxJsonDepth = 32;
/// Largest scenario file read, in bytes.
inline constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{1} << 28;

/// Stable enum names used by the format.
// format_name: support/formats.hpp, from the table of formats.
std::string_view value_profile_name(ValueProfile p) noexcept;
std::string_view convention_name(Convention c) noexcept;
std::string_view rope_style_name(RopeStyle s) noexcept;
std::string_view order_name(Order o) noexcept;
// step_kind_name: scenarios/step_kinds.hpp, from the table of step kinds.

/// Parses and validates a scenario document. `source` (a file name, or empty)
/// is appended to error messages; `where()` is the JSON path alone. Throws
/// kvcheck::Error: kJsonSyntax (malformed, truncated, duplicate key, too deep;
/// where = "byte N" for malformed text), kJsonType, kJsonUnknownKey,
/// kJsonMissingKey, kJsonValue, kSize, kNonFinite.
Scenario parse_scenario(std::string_view text, const std::string& source);

/// Reads and parses one file; kIo when it cannot be read.
Scenario load_scenario_file(const std::filesystem::path& path);

/// Checks every rule a parsed scenario obeys (ranges, size products, schedule
/// simulation, expectation shapes), for scenarios built in code. Also
/// requires step fields that do not belong to the step's kind to hold their
/// defaults, so that parse(save(s)) == s. Throws kvcheck::Error with the JSON
/// path the field would have.
void validate_scenario(const Scenario& scenario);

/// Canonical JSON text (ends with a newline). Validates first and throws
/// like validate_scenario, so the text always parses back to `scenario`.
std::string save_scenario(const Scenario& scenario);

/// Writes save_scenario(scenario) to `path` atomically through the one file
/// writer (support/atomic_write.hpp: a temporary file in the same directory,
/// fsync'ed, renamed over `path`). On any failure the temporary is removed
/// and an existing `path` is untouched; throws kIo.
void write_scenario_file(const std::filesystem::path& path, const Scenario& scenario);

/// Expands files and directories into a sorted, duplicate-free list. A
/// directory contributes every regular `*.json` file below it (recursively),
/// except `*.schema.json`; a file argument is taken as given. Throws kIo for
/// a path that does not exist or cannot be listed.
std::vector<std::filesystem::path> collect_scenario_files(const std::vector<std::string>& files_or_dirs);

}  // namespace kvcheck::scenarios
