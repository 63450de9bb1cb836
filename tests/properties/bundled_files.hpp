// The bundled scenario files properties_test reads (scenarios/fast/), one
// definition for every test file of the program (a unity build compiles
// several of them as one translation unit).
#pragma once

#include <filesystem>
#include <string>

#include "scenarios/scenario_json.hpp"

namespace kvcheck::test {

inline scenarios::Scenario bundled(const std::string& name) {
  return scenarios::load_scenario_file(std::filesystem::path(KVCHECK_SOURCE_DIR) / "scenarios" / "fast" /
                                       (name + ".json"));
}

}  // namespace kvcheck::test
