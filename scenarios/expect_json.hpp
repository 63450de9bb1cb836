// What a scenario file and a trace header share, written once for both
// formats: the "expect" object (read strictly: unknown keys, types, the JSON
// path at fault; written in its canonical key order), and the "rope" object
// and optional numbers of their cache objects.
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

/// The "rope" object of a cache: style, rotary_dims, base.
nlohmann::ordered_json rope_document(const Rope& rope);

/// A number, or null when absent (softmax_scale, sink_logit).
nlohmann::ordered_json optional_number(const std::optional<double>& v);

}  // namespace kvcheck::scenarios
