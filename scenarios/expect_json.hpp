// The "expect" object a scenario file and a trace header share: read
// strictly (unknown keys, types, the JSON path at fault) and written in its
// canonical key order, once for both formats.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "scenarios/scenario.hpp"

namespace kvcheck::scenarios {

/// Reads an "expect" object at `path` (null: no expectations). Throws
/// kvcheck::Error naming the JSON path at fault.
std::optional<Expectations> read_expectations(const nlohmann::json& j, const std::string& path);

/// The "expect" object of `e`: overwritten, collisions, output_tolerance.
nlohmann::ordered_json expectations_document(const Expectations& e);

}  // namespace kvcheck::scenarios
