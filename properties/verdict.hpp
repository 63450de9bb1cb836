// The verdict of one run, computed once from its observations: every query
// and step carries its own, the run fails exactly when some step failed, and
// reports only read these fields.
#pragma once

#include <string>

#include "properties/observation.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// Judges `run`'s steps and queries against `sc`'s expectations (overwritten
/// counts, collisions, output tolerances) and sets every verdict field:
/// per query `failed`, per step `failed` and its expectation text, the run's
/// totals, `first_failing_step`, `passed` and `first_failure`.
void judge_run(const scenarios::Scenario& sc, RunObservation* run);

/// Marks `run` failed; the first reason given is the one reports print.
void mark_failed(RunObservation* run, const std::string& why);

}  // namespace kvcheck::properties
