// The exec answer-parser fuzzer's schedule without libFuzzer (any compiler):
//   kvcheck_exec_answer_replay SEED...          each seed must answer every call
//   kvcheck_exec_answer_replay --record 'COMMAND' OUT
//                                               records a live adapter's answers
// ctest runs the first over engines/fuzz/seeds/, so the seeds stay a whole
// exchange as the parser changes; the second is how they were made.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engines/fuzz/exec_answer_schedule.hpp"

namespace {

constexpr int kWholeSchedule = 10;  // hello, open and the 8 calls

int record(const std::string& command, const std::string& out) {
  std::string answers;
  const int answered = kvcheck::engines::fuzz::run_answer_schedule(
      std::make_unique<kvcheck::engines::fuzz::RecordingTransport>(
          kvcheck::engines::start_exec_child(command, 10.0), &answers));
  if (answered != kWholeSchedule) {
    std::cerr << command << ": answered " << answered << " of " << kWholeSchedule << " calls:\n" << answers;
    return 1;
  }
  std::ofstream(out, std::ios::binary) << answers;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 4 && std::string(argv[1]) == "--record") return record(argv[2], argv[3]);
    if (argc < 2) {
      std::cerr << "usage: kvcheck_exec_answer_replay SEED... | --record 'COMMAND' OUT\n";
      return 2;
    }
    int bad = 0;
    for (int i = 1; i < argc; ++i) {
      std::ifstream in(argv[i], std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      int answered = 0;
      std::string error;
      try {
        answered = kvcheck::engines::fuzz::run_answer_schedule(
            std::make_unique<kvcheck::engines::fuzz::MemoryTransport>(text.str()));
      } catch (const kvcheck::Error& e) {
        error = e.what();
      }
      const bool ok = in.is_open() && answered == kWholeSchedule;
      std::cout << (ok ? "ok   " : "FAIL ") << argv[i] << ": " << answered << " of " << kWholeSchedule
                << " calls answered" << (error.empty() ? "" : " (" + error + ")") << "\n";
      bad += ok ? 0 : 1;
    }
    return bad == 0 ? 0 : 1;
  } catch (const kvcheck::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
