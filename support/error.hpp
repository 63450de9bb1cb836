// kvcheck::Error: the one exception type for bad input (files, flags, sizes).
// Tier 3 of the house error model: a stable id plus the JSON path or flag at
// fault, which the CLI prints as one line before exiting with code 2.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace kvcheck {

/// Stable error ids; numbers never change once released.
enum class ErrorId : int {
  kUsage = 100,           ///< unknown flag, missing value, bad range
  kJsonSyntax = 200,      ///< malformed or truncated JSON
  kJsonType = 201,        ///< a field has the wrong JSON type
  kJsonUnknownKey = 202,  ///< a key the schema does not define
  kJsonMissingKey = 203,  ///< a required key is absent
  kJsonValue = 204,       ///< a value breaks a rule (range, relation)
  kSize = 300,            ///< sizes whose product overflows, zero rings
  kNonFinite = 301,       ///< NaN or Inf where a finite number is required
  kMemory = 302,          ///< a run whose estimated memory exceeds what is available (or --memory-limit)
  kIo = 400,              ///< a file cannot be read or written
  kDevice = 500,          ///< CUDA requested but no device is present
  kAdapter = 600,         ///< an exec adapter broke the protocol (crash, bad line, timeout)
  kShard = 700,  ///< shards that are not one whole run (missing, duplicated, mismatched), a failed MPI rank
  kInternal = 900,     ///< a defect in kvcheck itself (exit code 3, never bad input)
  kOutOfMemory = 901,  ///< an allocation failed (exit code 3)
};

/// Bad input. `where()` names the field, flag or JSON path at fault.
class Error : public std::runtime_error {
 public:
  Error(ErrorId id, std::string where, const std::string& rule)
      : std::runtime_error(format(id, where, rule)), id_(id), where_(std::move(where)), rule_(rule) {}

  /// The stable error id.
  ErrorId id() const noexcept { return id_; }
  /// The JSON path, flag or field name at fault.
  const std::string& where() const noexcept { return where_; }
  /// The rule alone (what() without the "kvcheck error N at WHERE: " prefix).
  const std::string& rule() const noexcept { return rule_; }

 private:
  static std::string format(ErrorId id, const std::string& where, const std::string& rule) {
    return "kvcheck error " + std::to_string(static_cast<int>(id)) + " at " +
           (where.empty() ? std::string("<input>") : where) + ": " + rule;
  }
  ErrorId id_;
  std::string where_;
  std::string rule_;
};

}  // namespace kvcheck
