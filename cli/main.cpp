// kvcheck: the command-line front end. Argument parsing and dispatch only;
// the work is done by pipelines/ (which calls model/, properties/, sweep/ and reports/).
//
// Exit codes: 0 every property holds, 1 a property failed (the counterexample
// is written out), 2 bad usage or input (one line on stderr).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/usage.hpp"
#include "support/error.hpp"

#ifndef KVCHECK_VERSION
#define KVCHECK_VERSION "0.0.0"
#endif

int main(int argc, char** argv) {
  using namespace kvcheck;
  if (argc < 2) {
    std::fputs(cli::usage_text().c_str(), stderr);
    return 2;
  }
  const std::string command = argv[1];
  try {
    if (command == "help" || command == "--help" || command == "-h") {
      // `kvcheck help`, `kvcheck help --man` (the man page), `kvcheck help COMMAND`.
      if (argc > 3) throw Error(ErrorId::kUsage, argv[3], "help takes one argument: --man or a command");
      const std::string topic = argc == 3 ? argv[2] : "";
      if (topic.empty() || topic == "--help" || topic == "-h") {
        std::fputs(cli::usage_text().c_str(), stdout);
      } else if (topic == "--man") {
        std::fputs(cli::man_page(KVCHECK_VERSION).c_str(), stdout);
      } else if (const cli::CommandSpec* spec = cli::find_command(topic)) {
        std::fputs(cli::command_usage_text(*spec).c_str(), stdout);
      } else {
        throw Error(ErrorId::kUsage, topic, "unknown command (try `kvcheck help`)");
      }
      return 0;
    }
    if (command == "--version" || command == "version") {
      std::printf("kvcheck %s\n", KVCHECK_VERSION);
      return 0;
    }
    for (int i = 2; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--help" || flag == "-h") {
        const cli::CommandSpec* spec = cli::find_command(command);
        if (spec == nullptr) throw Error(ErrorId::kUsage, command, "unknown command (try `kvcheck help`)");
        std::fputs(cli::command_usage_text(*spec).c_str(), stdout);
        return 0;
      }
    }
    if (command == "demo") return cli::command_demo(argc, argv);
    if (command == "spec") return cli::command_spec(argc, argv);
    if (command == "check") return cli::command_check(argc, argv);
    if (command == "replay") return cli::command_replay(argc, argv);
    if (command == "trace") return cli::command_trace(argc, argv);
    if (command == "sweep") return cli::command_sweep(argc, argv);
    if (command == "faults") return cli::command_faults(argc, argv);
    if (command == "audit") return cli::command_audit(argc, argv);
    if (command == "merge") return cli::command_merge(argc, argv);
    if (command == "completion") return cli::command_completion(argc, argv);
    std::vector<std::string> names;
    for (const cli::CommandSpec& c : cli::command_table()) names.push_back(c.name);
    const std::string near = cli::closest_name(command, names);
    throw Error(ErrorId::kUsage, command,
                "unknown command (try `kvcheck help`)" + (near.empty() ? "" : "; did you mean " + near + "?"));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return e.id() == ErrorId::kInternal || e.id() == ErrorId::kOutOfMemory ? 3 : 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s\n", Error(ErrorId::kOutOfMemory, command, "out of memory").what());
    return 3;
  } catch (const std::exception& e) {
    // Not bad input: a defect in kvcheck. Its own id and exit code.
    std::fprintf(stderr, "%s\n",
                 Error(ErrorId::kInternal, command, std::string("internal error: ") + e.what()).what());
    return 3;
  }
}
