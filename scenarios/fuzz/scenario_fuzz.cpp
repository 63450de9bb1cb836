// libFuzzer target for the scenario parser. Any input either parses or throws
// kvcheck::Error; every other exception, crash or sanitizer report is a bug.
// A parsed scenario must also survive the canonical round trip:
// parse(save(s)) == s and save is byte-stable.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kvcheck::scenarios;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Scenario scenario;
  try {
    scenario = parse_scenario(text, "fuzz-input");
  } catch (const kvcheck::Error&) {
    return 0;  // rejected input: the expected outcome for most inputs
  }
  // Not caught: a kvcheck::Error here means save wrote text parse refuses.
  const std::string saved = save_scenario(scenario);
  const Scenario again = parse_scenario(saved, "fuzz-roundtrip");
  if (!(again == scenario)) std::abort();
  if (save_scenario(again) != saved) std::abort();
  return 0;
}
