// Scenario files: load (read, parse, validate, naming the file in errors),
// write atomically through support/atomic_write.hpp, and collect *.json
// files from the command line's files and directories.
#include "scenarios/scenario_json.hpp"

#include <string>
#include <vector>

#include "scenarios/json_read.hpp"
#include "support/atomic_write.hpp"

namespace kvcheck::scenarios {

using namespace json_read;

Scenario load_scenario_file(const std::filesystem::path& path) {
  return parse_scenario(read_input_file(path, "a scenario file"), path.string());
}

void write_scenario_file(const std::filesystem::path& path, const Scenario& scenario) {
  write_file_atomic(path, save_scenario(scenario));  // save_scenario throws before touching the disk
}

std::vector<std::filesystem::path> collect_scenario_files(const std::vector<std::string>& files_or_dirs) {
  return collect_files(files_or_dirs, [](const std::filesystem::path& p) {
    const std::string file = p.filename().string();
    const std::string_view suffix = ".schema.json";
    return p.extension() == ".json" &&
           !(file.size() >= suffix.size() &&
             file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0);
  });
}

}  // namespace kvcheck::scenarios
