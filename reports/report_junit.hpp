// JUnit XML report for CI systems: one <testsuite> per invocation, one
// <testcase> per run (plus one for the property check, when present); a
// failing run carries <failure message="first failure"> with the text
// explanation as its body. No timestamps or durations: output is byte-stable.
#pragma once

#include <string>

#include "reports/report.hpp"

namespace kvcheck::reports {

/// The report as a JUnit XML document (UTF-8, trailing newline).
std::string report_junit(const Report& report);

}  // namespace kvcheck::reports
