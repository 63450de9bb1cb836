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

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "support/error.hpp"

namespace {

constexpr const char* kUsage = R"(kvcheck: verify LLM attention KV caches against a high-precision reference

usage:
  kvcheck demo   [--cases N] [--out DIR] [--scenarios DIR]     the main job: golden values, bundled scenarios, a check, HTML report
  kvcheck spec                                                 recompute the golden values with the reference model
  kvcheck check  [--impl IMPL] [--fault NAME] [--cases N] [--seed X] [--out DIR] [--threads T] [--precision 53|113|169]
                 [--step-timeout S] [--record TRACE] [--shard I/N] [--profile default|production]
                 [--memory-limit BYTES] [--reference certified|mpfr] [--min-run-share F]
  kvcheck replay FILE|DIR... [--impl IMPL] [--fault NAME] [--report FILE] [--junit FILE] [--html FILE] [--precision BITS]
                 [--step-timeout S] [--record TRACE] [--memory-limit BYTES] [--reference certified|mpfr]
  kvcheck audit  TRACE|DIR... [--report FILE] [--junit FILE] [--html FILE] [--text FILE] [--precision BITS] [--memory-limit BYTES]
  kvcheck trace  --window W --ring S --state B --positions P1,P2,... [--json]
  kvcheck sweep  --window A[:B[:STEP]] --drafts K1[:K2] --chunk C1[:C2] --order store-then-load|load-then-store|both
                 [--states N] [--json FILE] [--csv FILE] [--svg FILE] [--formula EXPR] [--out DIR]
                 [--counterexamples auto|all|none] [--threads T] [--impl layer|exec:CMD] [--step-timeout S]
                 [--shard I/N] [--memory-limit BYTES]
  kvcheck merge  SHARD_DIR... [--impl IMPL] [--out DIR] [--json FILE] [--csv FILE] [--svg FILE] [--memory-limit BYTES]
                                                               join the shards of a check or sweep into its report
  kvcheck faults                                               list the named faults

IMPL: cpu (default), cuda, layer (the layer-bound cache), or exec:'COMMAND ARGS' (an engine's adapter
speaking the JSON Lines protocol of adapters/PROTOCOL.md)

--shard I/N runs the cases (check) or columns (sweep) whose index is I mod N and writes DIR/shard.json;
`kvcheck merge` writes the whole run's report, byte for byte one process's; it runs no command from a shard
document: a failing case is re-run on merge's own --impl, which must be the shards' engine. Under `mpirun -n R` (an MPI
build) each rank runs one shard and rank 0 writes the report.

exit codes: 0 all properties hold, 1 a property failed, 2 bad usage or input, 3 an internal error
`kvcheck COMMAND --help` prints one command's usage; `kvcheck --version` the version.
)";

#ifndef KVCHECK_VERSION
#define KVCHECK_VERSION "0.0.0"
#endif

/// The usage of one command: its lines of kUsage (with their continuation
/// lines), then the IMPL and exit-code notes. Empty for an unknown command.
std::string command_usage(const std::string& command) {
  const std::string text = kUsage;
  const std::string head = "  kvcheck " + command + " ";
  std::string out, notes;
  bool in_command = false;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    if (line.rfind("  kvcheck ", 0) == 0)
      in_command = line.rfind(head, 0) == 0 || line == "  kvcheck " + command;
    else if (line.rfind("                 ", 0) != 0)
      in_command = false;
    if (in_command) out += line + "\n";
    if (line.rfind("IMPL:", 0) == 0 || line.rfind("speaking", 0) == 0 || line.rfind("exit codes:", 0) == 0)
      notes += line + "\n";
  }
  return out.empty() ? out : "usage:\n" + out + "\n" + notes;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvcheck;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = argv[1];
  try {
    if (command == "help" || command == "--help" || command == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (command == "--version" || command == "version") {
      std::printf("kvcheck %s\n", KVCHECK_VERSION);
      return 0;
    }
    for (int i = 2; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--help" || flag == "-h") {
        const std::string usage = command_usage(command);
        if (usage.empty()) throw Error(ErrorId::kUsage, command, "unknown command (try `kvcheck help`)");
        std::fputs(usage.c_str(), stdout);
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
    throw Error(ErrorId::kUsage, command, "unknown command (try `kvcheck help`)");
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
