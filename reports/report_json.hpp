// The machine-readable report: one self-describing JSON document
// ("report_version", "schema_version", "name", "description") with the
// invocation context and, per run, per step and per query, everything docs/semantics.md "What is judged"
// observes. Keys keep a fixed order and nothing depends on the clock, so equal
// reports serialize to identical bytes.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "reports/report.hpp"

namespace kvcheck::reports {

/// Version of the report layout; bumped on any incompatible change.
inline constexpr int kReportVersion = 1;
/// Version of the JSON schema the document follows.
inline constexpr int kReportSchemaVersion = 1;

/// The report as an ordered JSON value (keys in a fixed order).
nlohmann::ordered_json report_to_json(const Report& report);

/// The report as JSON text: two-space indent, trailing newline, shortest
/// round-trip doubles, non-finite numbers as null, invalid UTF-8 replaced.
std::string report_json_text(const Report& report);

}  // namespace kvcheck::reports
