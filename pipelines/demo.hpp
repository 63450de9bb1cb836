// The demo pipeline behind `kvcheck demo` (the README's first command):
// the golden values by the reference model, the bundled scenarios replayed on the CPU
// backend, a randomized check, a small capacity sweep, an engine in another
// process checked live (correct, then with its bug switched on), a recorded
// trace audited, and the report set written. cli/ reads the flags.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "sweep/sweep.hpp"

namespace kvcheck::pipelines {

/// What `kvcheck demo` was asked for.
struct DemoOptions {
  std::filesystem::path out_dir =
      "kvcheck-out";             ///< the report set; the live runs' counterexample in out_dir/exec
  std::string scenarios_dir;     ///< the bundled scenarios replayed in part 2
  std::string source_dir = ".";  ///< the source tree: adapters/ and traces/ are read from it
  std::int64_t cases = 300;      ///< cases of the randomized checks
  std::uint64_t seed = 1;
  std::string command;  ///< the command line as reports record it
  std::function<void(std::int64_t done, std::int64_t total)> progress;  ///< the checks' progress, or empty
};

/// The demo's sweep grid: W 128, k 0, 1, 5, C 1, 64, both prefill orders.
sweep::SweepGrid demo_grid();

/// Runs the demo, printing each part and writing them all into one report
/// (reports::Report::parts: text, JSON, JUnit and HTML hold every part);
/// returns 0 when every part showed what it is meant to (the two planted
/// faults, the bug switch and the early-free trace, must be caught), 1
/// otherwise, 2 when its reports could not be written. The last line printed
/// is report.txt's: "PASS: 7 parts: 7 showed what they should; 2 of 2
/// planted faults caught".
int run_demo(const DemoOptions& options);

}  // namespace kvcheck::pipelines
