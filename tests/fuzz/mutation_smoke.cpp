// A deterministic mutation smoke run of a libFuzzer entry point, with any
// compiler and without libFuzzer: compiled together with one fuzz target's
// .cpp (scenarios/fuzz/scenario_fuzz.cpp, scenarios/fuzz/trace_fuzz.cpp or
// engines/fuzz/exec_answer_fuzz.cpp) and one of KVCHECK_SMOKE_SCENARIO,
// KVCHECK_SMOKE_TRACE or KVCHECK_SMOKE_EXEC_ANSWER, it feeds that target's
// LLVMFuzzerTestOneInput every seed file as it is, then --runs mutations of
// them: bit flips, bytes set to or inserted as interesting values, spans
// erased or duplicated, truncation, dictionary tokens (libFuzzer .dict files)
// inserted or written over, and splices of two seeds. The mutations are a
// function of --seed alone (no time budget): the same command runs the same
// inputs everywhere.
//
//   kvcheck_<target>_smoke [--seed N] [--runs N] [--dict FILE]...
//       [--expect-accepted-min N] [--expect-refused-min N] SEED_FILE_OR_DIR...
//
// The entry point judges each input (kvcheck::Error is a refusal; a failed
// round trip or shape aborts); a crash, abort or sanitizer report ends the run
// with the input written to mutation-smoke-crash-input in the working
// directory (replay it: pass it as the only seed with --runs 0). Exit 0 when
// every input ran and the mutated inputs were accepted and refused at least
// as often as expected (so the run is not vacuous), 1 when they were not,
// 2 for a bad command line or no seeds.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "support/error.hpp"

#if defined(KVCHECK_SMOKE_SCENARIO)
#include "scenarios/scenario_json.hpp"
#elif defined(KVCHECK_SMOKE_TRACE)
#include "scenarios/trace_json.hpp"
#elif defined(KVCHECK_SMOKE_EXEC_ANSWER)
#include "engines/fuzz/exec_answer_schedule.hpp"
#else
#error "define KVCHECK_SMOKE_SCENARIO, KVCHECK_SMOKE_TRACE or KVCHECK_SMOKE_EXEC_ANSWER"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KVCHECK_SMOKE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVCHECK_SMOKE_ASAN 1
#endif
#endif
#ifdef KVCHECK_SMOKE_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

/// Whether the target's parser takes `text` (the entry point returns 0 either
/// way, so the driver asks the parser itself to count).
bool accepted(std::string_view text) {
  try {
#if defined(KVCHECK_SMOKE_SCENARIO)
    (void)kvcheck::scenarios::parse_scenario(text, "smoke");
#elif defined(KVCHECK_SMOKE_TRACE)
    (void)kvcheck::scenarios::parse_trace(text, "smoke");
#else
    (void)kvcheck::engines::fuzz::run_answer_schedule(
        std::make_unique<kvcheck::engines::fuzz::MemoryTransport>(text));
#endif
    return true;
  } catch (const kvcheck::Error&) {
    return false;
  }
}

// ---- what a crash leaves behind ----
const std::string* g_input = nullptr;
long g_index = -1;
constexpr const char* kCrashFile = "mutation-smoke-crash-input";

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n <= 0) return;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

/// Async-signal-safe: names the input and writes it to kCrashFile.
void report_crash() {
  char line[96] = "mutation smoke: crash on input #";
  std::size_t len = std::strlen(line);
  char digits[24];
  int d = 0;
  unsigned long index = static_cast<unsigned long>(g_index < 0 ? 0 : g_index);
  do digits[d++] = static_cast<char>('0' + index % 10);
  while ((index /= 10) != 0 && d < 24);
  while (d > 0) line[len++] = digits[--d];
  const char tail[] = ", written to mutation-smoke-crash-input\n";
  std::memcpy(line + len, tail, sizeof tail - 1);
  write_all(2, line, len + sizeof tail - 1);
  if (g_input == nullptr) return;
  const int fd = ::open(kCrashFile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  write_all(fd, g_input->data(), g_input->size());
  ::close(fd);
}

extern "C" void on_fatal_signal(int sig) {
  report_crash();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

#ifdef KVCHECK_SMOKE_ASAN
extern "C" void on_sanitizer_death() {
  report_crash();
}
#endif

void install_crash_reporting() {
  std::signal(SIGABRT, on_fatal_signal);  // abort(), std::terminate, assert
#ifdef KVCHECK_SMOKE_ASAN
  __sanitizer_set_death_callback(on_sanitizer_death);  // ASan and UBSan reports, SEGV
#else
  std::signal(SIGSEGV, on_fatal_signal);
  std::signal(SIGBUS, on_fatal_signal);
  std::signal(SIGFPE, on_fatal_signal);
  std::signal(SIGILL, on_fatal_signal);
#endif
}

// ---- inputs ----
std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// A libFuzzer dictionary: one "quoted" token a line (optionally name=
/// before it), with \\, \" and \xNN escapes; # comments.
std::vector<std::string> read_dict(const std::filesystem::path& path) {
  std::vector<std::string> tokens;
  std::istringstream lines(read_file(path));
  std::string line;
  while (std::getline(lines, line)) {
    const auto open = line.find('"');
    const auto close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) continue;
    std::string token;
    for (std::size_t i = open + 1; i < close; ++i) {
      if (line[i] != '\\' || i + 1 >= close) {
        token += line[i];
      } else if (line[i + 1] == 'x' && i + 3 < close) {
        token += static_cast<char>(std::stoi(line.substr(i + 2, 2), nullptr, 16));
        i += 3;
      } else {
        token += line[++i];
      }
    }
    if (!token.empty()) tokens.push_back(token);
  }
  return tokens;
}

/// splitmix64: the same sequence with every compiler and standard library.
struct Rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
};

constexpr unsigned char kInteresting[] = {0,   0xff, 0x7f, 0x80, '"', '{', '}', '[', ']',
                                          ',', ':',  '-',  '+',  '.', 'e', '0', '1', '2',
                                          '7', '9',  '\\', '\n', ' ', 'n', 't'};

char interesting(Rng& rng) {
  return static_cast<char>(kInteresting[rng.below(sizeof kInteresting)]);
}

void mutate_once(Rng& rng, std::string& s, const std::vector<std::string>& seeds,
                 const std::vector<std::string>& dict) {
  const std::size_t size = s.size();
  const std::size_t pos = rng.below(size + 1);             // an insertion point
  const std::size_t at = size == 0 ? 0 : rng.below(size);  // a byte
  const std::size_t span = 1 + rng.below(std::min<std::size_t>(32, size == 0 ? 1 : size));
  switch (rng.below(10)) {
    case 0:
      if (size > 0) s[at] = static_cast<char>(s[at] ^ (1 << rng.below(8)));
      break;
    case 1:
      if (size > 0) s[at] = interesting(rng);
      break;
    case 2: s.insert(pos, 1, interesting(rng)); break;
    case 3:
      if (size > 0) s.erase(at, span);
      break;
    case 4: s.resize(pos); break;
    case 5:
      if (size > 0) s.insert(pos, s.substr(at, span));
      break;
    case 6:
      if (!dict.empty()) s.insert(pos, dict[rng.below(dict.size())]);
      break;
    case 7:
      if (!dict.empty() && size > 0) {
        const std::string& token = dict[rng.below(dict.size())];
        s.replace(at, std::min(token.size(), size - at), token);
      }
      break;
    case 8: {  // splice: this seed's head, another's tail
      const std::string& other = seeds[rng.below(seeds.size())];
      s = s.substr(0, pos) + other.substr(rng.below(other.size() + 1));
      break;
    }
    default:  // a digit for a digit: numbers stay numbers, values change
      for (std::size_t i = 0; i < size; ++i) {
        const std::size_t j = (at + i) % size;
        if (s[j] >= '0' && s[j] <= '9') {
          s[j] = static_cast<char>('0' + rng.below(10));
          break;
        }
      }
      break;
  }
}

int usage(const std::string& why) {
  std::cerr << why
            << "\nusage: mutation smoke [--seed N] [--runs N] [--dict FILE]... [--expect-accepted-min N]"
               " [--expect-refused-min N] SEED_FILE_OR_DIR...\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  long runs = 1000;
  long expect_accepted = 0, expect_refused = 0;
  std::vector<std::string> seeds, dict;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const bool has_value = i + 1 < argc;
      if (arg == "--seed" && has_value) {
        seed = std::stoull(argv[++i]);
      } else if (arg == "--runs" && has_value) {
        runs = std::stol(argv[++i]);
      } else if (arg == "--dict" && has_value) {
        const auto tokens = read_dict(argv[++i]);
        dict.insert(dict.end(), tokens.begin(), tokens.end());
      } else if (arg == "--expect-accepted-min" && has_value) {
        expect_accepted = std::stol(argv[++i]);
      } else if (arg == "--expect-refused-min" && has_value) {
        expect_refused = std::stol(argv[++i]);
      } else if (arg.starts_with("--")) {
        return usage("unknown or incomplete option " + arg);
      } else if (std::filesystem::is_directory(arg)) {
        std::vector<std::filesystem::path> files;
        for (const auto& entry : std::filesystem::directory_iterator(arg))
          if (entry.is_regular_file()) files.push_back(entry.path());
        std::sort(files.begin(), files.end());
        for (const auto& f : files) seeds.push_back(read_file(f));
      } else if (std::filesystem::is_regular_file(arg)) {
        seeds.push_back(read_file(arg));
      } else {
        return usage("no such seed file or directory: " + arg);
      }
    }
  } catch (const std::exception& e) {
    return usage(std::string("bad command line: ") + e.what());
  }
  if (seeds.empty()) return usage("no seeds");

  install_crash_reporting();
  long seeds_accepted = 0, mutants_accepted = 0;
  std::string input;
  g_input = &input;
  Rng rng{seed};
  const long total = static_cast<long>(seeds.size()) + runs;
  for (g_index = 0; g_index < total; ++g_index) {
    const bool is_seed = g_index < static_cast<long>(seeds.size());
    if (is_seed) {
      input = seeds[static_cast<std::size_t>(g_index)];
    } else {
      input = seeds[rng.below(seeds.size())];
      const std::size_t stacked = 1 + rng.below(4);
      for (std::size_t m = 0; m < stacked; ++m) mutate_once(rng, input, seeds, dict);
      if (input.size() > (1u << 16)) input.resize(1u << 16);  // duplication stays bounded
    }
    const bool ok = accepted(input);
    (is_seed ? seeds_accepted : mutants_accepted) += ok ? 1 : 0;
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
  }
  g_input = nullptr;

  const long refused = runs - mutants_accepted;
  std::cout << "mutation smoke (seed " << seed << "): " << total << " inputs run: " << seeds.size()
            << " seeds (" << seeds_accepted << " accepted) and " << runs << " mutations (" << mutants_accepted
            << " accepted, " << refused << " refused); " << dict.size() << " dictionary tokens\n";
  bool ok = true;
  if (mutants_accepted < expect_accepted) {
    std::cout << "FAIL: fewer than " << expect_accepted << " mutated inputs accepted\n";
    ok = false;
  }
  if (refused < expect_refused) {
    std::cout << "FAIL: fewer than " << expect_refused << " mutated inputs refused\n";
    ok = false;
  }
  return ok ? 0 : 1;
}
