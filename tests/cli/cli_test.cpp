// The kvcheck executable end to end: exit codes, one-line errors, the fault
// acceptance runs, replay of counterexamples, and byte-identical reports.
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "scenarios/scenario_json.hpp"

namespace fs = std::filesystem;

namespace {

struct Outcome {
  int code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path temp_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("kvcheck-cli-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

Outcome run(const std::string& args) {
  static int counter = 0;
  const fs::path dir = temp_dir("run" + std::to_string(counter++));
  const std::string cmd = std::string(KVCHECK_BINARY) + " " + args + " >" + (dir / "out").string() + " 2>" +
                          (dir / "err").string();
  const int status = std::system(cmd.c_str());
  Outcome o;
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.out = slurp(dir / "out");
  o.err = slurp(dir / "err");
  fs::remove_all(dir);
  return o;
}

std::size_t lines(const std::string& s) {
  std::size_t n = 0;
  for (const char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("CLI: trace prints docs/semantics.md table and its JSON form") {
  const Outcome text = run("trace --window 128 --ring 134 --state 2 --positions 127,128,133,134");
  REQUIRE(text.code == 0);
  CHECK(text.out.find("134 | 7..134          | 275 / 268             | 268") != std::string::npos);
  const Outcome json = run("trace --window 128 --ring 134 --state 3 --positions 134 --json");
  REQUIRE(json.code == 0);
  const auto doc = nlohmann::json::parse(json.out);
  REQUIRE(doc.size() == 1);
  CHECK(doc[0]["first_read_slot"] == 409);
  CHECK(doc[0]["last_read_slot"] == 402);
  CHECK(doc[0]["write_slot"] == 402);
  CHECK(doc[0]["logical_first"] == 7);
}

TEST_CASE("CLI: bad trace arguments give exit 2 and one line naming the flag") {
  for (const char* args :
       {"trace --window 0 --ring 5 --state 0 --positions 1",
        "trace --window 3 --ring 5 --state 0 --positions 1,-2", "trace --window 3 --ring 5 --positions 1",
        "trace --window x --ring 5 --state 0 --positions 1",
        "trace --window 3 --ring 5 --state 0 --positions 1 --bogus 2"}) {
    INFO(args);
    const Outcome o = run(args);
    CHECK(o.code == 2);
    CHECK(lines(o.err) == 1);
    CHECK(o.err.find("--") != std::string::npos);
  }
}

TEST_CASE("CLI: faults lists every named fault") {
  const Outcome o = run("faults");
  REQUIRE(o.code == 0);
  CHECK(lines(o.out) == 10);
  CHECK(o.out.find("ring-sized-window") != std::string::npos);
}

TEST_CASE("CLI: every named fault fails check at 2000 cases, shrinks small and replays") {
  const fs::path dir = temp_dir("faults");
  const Outcome clean = run("check --cases 2000 --seed 1 --out " + (dir / "none").string());
  CHECK(clean.code == 0);
  const Outcome list = run("faults");
  std::istringstream names(list.out);
  std::string line;
  int faults = 0;
  while (std::getline(names, line)) {
    const std::string fault = line.substr(0, line.find(' '));
    INFO("fault " << fault);
    ++faults;
    const fs::path out = dir / fault;
    // Stopped at its fourth failing case: the counterexample is the one a
    // run of all 2000 shrinks (the same lowest failing cases).
    const Outcome o = run("check --fault " + fault + " --cases 2000 --seed 1 --max-failures 4 --out " + out.string());
    CHECK(o.code == 1);
    const fs::path file = out / ("counterexample-" + fault + "-seed1.json");
    REQUIRE(fs::exists(file));
    const auto sc = kvcheck::scenarios::load_scenario_file(file);
    CHECK(sc.requests.size() <= 3);
    CHECK(sc.steps.size() <= 8);
    CHECK(run("replay " + file.string() + " --fault " + fault).code == 1);
    CHECK(run("replay " + file.string()).code == 0);
  }
  CHECK(faults == 10);
  fs::remove_all(dir);
}

TEST_CASE("CLI: the same seed gives byte-identical reports") {
  const fs::path dir = temp_dir("determinism");
  const std::string args = " --fault accept-no-rollback --cases 300 --seed 5 --out ";
  CHECK(run("check" + args + (dir / "a").string()).code == 1);
  CHECK(run("check" + args + (dir / "b").string()).code == 1);
  for (const char* f : {"report.json", "report.txt", "report.html", "junit.xml"}) {
    INFO(f);
    std::string a = slurp(dir / "a" / f);
    std::string b = slurp(dir / "b" / f);
    // The output directory is part of the command line; normalise it.
    for (auto* s : {&a, &b}) {
      for (const char* d : {"/a", "/b"}) {
        const std::string needle = (dir.string() + d);
        for (auto pos = s->find(needle); pos != std::string::npos; pos = s->find(needle)) {
          s->replace(pos, needle.size(), "<out>");
        }
      }
    }
    CHECK(!a.empty());
    CHECK(a == b);
  }
  fs::remove_all(dir);
}

TEST_CASE("CLI: malformed scenario files give exit 2 and one line with the JSON path") {
  const fs::path dir = temp_dir("malformed");
  const std::string good = slurp(fs::path(KVCHECK_SOURCE_DIR) / "scenarios/fast/verify-s133.json");
  struct Case {
    std::string name, text, where;
  };
  auto replace = [&good](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto pos = s.find(from);
    REQUIRE(pos != std::string::npos);
    return s.replace(pos, from.size(), to);
  };
  const Case cases[] = {
      {"truncated", good.substr(0, good.size() / 2), "byte"},
      {"wrong-type", replace("\"ring_rows\": 133", "\"ring_rows\": \"133\""), "cache.ring_rows"},
      {"unknown-key", replace("\"ring_rows\": 133", "\"ring_rows\": 133, \"colour\": 1"), "cache.colour"},
      {"zero-ring", replace("\"ring_rows\": 133", "\"ring_rows\": 0"), "cache.ring_rows"},
      {"overflow", replace("\"ring_rows\": 133", "\"ring_rows\": 9223372036854775807"), "cache"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const fs::path file = dir / (c.name + ".json");
    std::ofstream(file) << c.text;
    const Outcome o = run("replay " + file.string());
    CHECK(o.code == 2);
    CHECK(lines(o.err) == 1);
    CHECK(o.err.find(c.where) != std::string::npos);
    CHECK(slurp(file) == c.text);  // the input is left as it was
  }
  fs::remove_all(dir);
}

// ---- engines as external processes (--impl exec:...) -------------------------

#ifndef KVCHECK_EXEC_CASES
#define KVCHECK_EXEC_CASES 2000
#endif

namespace {

const std::string kExecCases = std::to_string(KVCHECK_EXEC_CASES);

std::string adapter(const std::string& script, const std::string& args = "") {
  return "'exec:python3 " + std::string(KVCHECK_SOURCE_DIR) + "/adapters/" + script +
         (args.empty() ? "" : " " + args) + "'";
}

}  // namespace

TEST_CASE("CLI exec: the bundled ring and paged adapters pass 2000 cases through the protocol") {
  const fs::path dir = temp_dir("exec-pass");
  // The paged adapter also as an engine that stores a step's rows before it
  // attends (--store-first): the pool kvcheck gives (pool_blocks) is enough.
  // The variants run 500 cases (each old class is gated from one case, a
  // feature from 100; pairs from 1000 are gated in the plain runs).
  struct Run {
    const char* script;
    const char* args;
    std::string cases;
  };
  const Run runs[] = {
      {"ring_cache.py", "", kExecCases},
      {"paged_cache.py", "", kExecCases},
      {"paged_cache.py", "--store-first", "500"},
      {"ring_cache.py", "--output-format bf16", "500"},        // outputs rounded to bf16, and declared
      {"paged_cache.py", "--preempt --prefix-cache", "500"}};  // preempts resumed with prefix hits
  for (const auto& [script, args, cases] : runs) {
    INFO(script << " " << args);
    std::string name = std::string(script) + args;
    std::replace(name.begin(), name.end(), ' ', '_');  // one argument
    const Outcome o = run("check --impl " + adapter(script, args) + " --cases " + cases + " --seed 1 --out " +
                          (dir / name).string());
    INFO(o.out << o.err);
    CHECK(o.code == 0);
    CHECK(o.out.find(cases + " cases (" + cases + " ran, 0 refused, 0 skipped), 0 failing") != std::string::npos);
    // Every coverage class is reached through the protocol too.
    CHECK(o.out.find("=0") == std::string::npos);
  }
  fs::remove_all(dir);
}

namespace {

/// The paged adapter's shared-prefix bugs (paged_cache.py PREFIX_BUGS).
bool prefix_bug(const std::string& bug) {
  return bug == "free-shared" || bug == "cow-skipped" || bug == "evicted-prefix-reused" ||
         bug == "evict-leaves-hash" || bug == "partial-block-hash";
}

}  // namespace

TEST_CASE(
    "CLI exec: every adapter bug switch is caught by a plain check of 2000 cases (no --profile) and shrunk to "
    "<= 3 requests, 8 steps") {
  const fs::path dir = temp_dir("exec-bugs");
  // Every switch `--list-bugs` prints, each caught by the check a user runs
  // first: no profile. The features a switch breaks (trims, a window per
  // layer, shared prefixes, long paged runs) are drawn because the adapter
  // declares them (issue 29); before, seven of these passed a plain check.
  const std::pair<const char*, const char*> bugs[] = {
      {"ring_cache.py", "ring-sized-window"},
      {"ring_cache.py", "rope-at-slot"},
      {"ring_cache.py", "window-plus-one"},
      {"paged_cache.py", "free-speculative"},
      {"paged_cache.py", "free-early"},
      {"paged_cache.py", "left-as-keys"},
      {"ring_cache.py", "bf16-truncate"},          // caught from the stored rows the adapter reports
      {"ring_cache.py", "zero-output"},            // every value profile judges outputs (README "Tolerances")
      {"ring_cache.py", "keep-drafts-on-finish"},  // schedules that finish or reset with drafts pending
      {"ring_cache.py", "trim-keeps-drafts"},      // trims with drafts pending
      {"paged_cache.py", "trim-keeps-drafts"},     // the same, in the paged cache (implies --trims)
      {"ring_cache.py", "layer-window-swapped"},   // per-layer windows
      {"paged_cache.py", "layer-window-swapped"},  // the same, freeing by the wrong window too
      {"paged_cache.py", "double-free"},  // a block freed by the window and again at finish: long runs
      {"ring_cache.py", "padding-through-ring"},  // padding answered as "padded", over live rows
      {"paged_cache.py", "no-window-free"},       // past its declared resident bound (frees answered)
      // Shared prefixes (each switch turns on --prefix-cache):
      {"paged_cache.py", "free-shared"},            // the window frees a block a sharer still sees
      {"paged_cache.py", "cow-skipped"},            // a write into a shared block changes the other's rows
      {"paged_cache.py", "evicted-prefix-reused"},  // an evicted prefix's block ids reused as if present
      {"paged_cache.py", "evict-leaves-hash"},      // an evicted cached block still found by its hash
      {"paged_cache.py", "partial-block-hash"},     // own rows cached under the prefix's hash
      {"paged_cache.py", "recompute-drops-last"},   // a begin's missed rows stored by its step, but one
      // Declared slack (each switch implies its option: --lookahead 4, --free-deferral 2):
      {"paged_cache.py", "lookahead-shared"},  // a lookahead block handed out twice
      {"paged_cache.py", "lookahead-leak"},    // lookahead blocks never returned: out of blocks
      {"paged_cache.py", "free-late"},         // frees a step later than its declared deferral
      // One pool across layers (implies --shared-pool): a block another layer still reads handed out.
      {"paged_cache.py", "shared-pool-double"},
      // Preemption (implies --preempt): a resume reads blocks the preempt freed.
      {"paged_cache.py", "preempt-stale-table"},
      // The same with the prefix cache (implies --preempt --prefix-cache): a resume takes back by id a
      // block its preempt cached, which another request's write evicted since.
      {"paged_cache.py", "resume-stale-cached"},
      // Outputs truncated into bf16 (implies --output-format bf16): up to one ULP, over the half an ULP allowed.
      {"ring_cache.py", "output-truncated"}};
  for (const auto& [script, bug] : bugs) {
    INFO(script << " --bug " << bug);
    const fs::path out = dir / (std::string(script) + "-" + bug);
    // It stops at its fourth failing case (--max-failures: the lowest four
    // are what the shrinker may take), and says so; a rare bug runs all.
    const Outcome o = run("check --impl " + adapter(script, std::string("--bug ") + bug) + " --cases " +
                          kExecCases + " --seed 1 --max-failures 4 --out " + out.string());
    INFO(o.out << o.err);
    CHECK(o.code == 1);
    if (o.out.find("stopped after 4 failing cases (--max-failures)") == std::string::npos) {
      CHECK(o.out.find(kExecCases + " cases (") != std::string::npos);  // fewer than 4 failed: every case ran
    }
    const fs::path file = out / "counterexample-exec-seed1.json";
    REQUIRE(fs::exists(file));
    const auto sc = kvcheck::scenarios::load_scenario_file(file);
    CHECK(sc.requests.size() <= 3);
    CHECK(sc.steps.size() <= 8);
    // The printed replay command is exact: it fails the same way.
    CHECK(o.out.find("replay: kvcheck replay " + file.string() + " --impl " +
                     adapter(script, std::string("--bug ") + bug)) != std::string::npos);
    CHECK(run("replay " + file.string() + " --impl " + adapter(script, std::string("--bug ") + bug)).code ==
          1);
    // Without the bug (the same cache: sharing prefixes for a prefix bug,
    // trimming for the paged trim bug) the case passes.
    const std::string name(bug);
    const bool paged = std::string(script) == "paged_cache.py";
    const std::string correct = name == "partial-block-hash"                ? "--content-hash"
                                : name == "recompute-drops-last"            ? "--recompute-in-step"
                                : name == "resume-stale-cached"             ? "--preempt --prefix-cache"
                                : prefix_bug(bug)                           ? "--prefix-cache"
                                : paged && name == "trim-keeps-drafts"      ? "--trims"
                                : paged && name.rfind("lookahead-", 0) == 0 ? "--lookahead 4"
                                : paged && name == "free-late"              ? "--free-deferral 2"
                                : paged && name == "shared-pool-double"     ? "--shared-pool"
                                : paged && name == "preempt-stale-table"    ? "--preempt"
                                : name == "output-truncated"                ? "--output-format bf16"
                                                                            : "";
    CHECK(run("replay " + file.string() + " --impl " + adapter(script, correct)).code == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE(
    "CLI exec: a declared bf16 output format: rounded outputs pass declared and fail undeclared, and "
    "--bitwise "
    "compares in bf16, seeing one ULP") {
  const fs::path dir = temp_dir("output-format");
  const std::string bf16 = adapter("ring_cache.py", "--output-format bf16");
  // The declaration is what makes rounded outputs correct: undeclared, they
  // are held to the accumulation's tolerance and fail.
  const Outcome declared =
      run("check --impl " + bf16 + " --cases 100 --seed 2 --out " + (dir / "declared").string());
  INFO(declared.out << declared.err);
  CHECK(declared.code == 0);
  // Truncated instead of rounded, it fails, and the reports name the format and its term.
  const Outcome truncated = run("check --impl " + adapter("ring_cache.py", "--bug output-truncated") +
                                " --cases 100 --seed 2 --out " + (dir / "truncated").string());
  INFO(truncated.out << truncated.err);
  CHECK(truncated.code == 1);
  CHECK(truncated.out.find("of which bf16 output rounding ") != std::string::npos);
  CHECK(slurp(dir / "truncated" / "report.txt").find(" out=bf16 ") != std::string::npos);  // the run line
  const auto report = nlohmann::json::parse(slurp(dir / "truncated" / "report.json"));
  REQUIRE(report["runs"].size() == 1);
  CHECK(report["runs"][0]["output_format"] == "bf16");
  CHECK(report["runs"][0]["totals"]["max_output_rounding_tolerance"].get<double>() > 0);
  const Outcome undeclared =
      run("check --impl " + adapter("ring_cache.py", "--output-format bf16 --undeclared-output-format") +
          " --cases 100 --seed 2 --out " + (dir / "undeclared").string());
  INFO(undeclared.out << undeclared.err);
  CHECK(undeclared.code == 1);
  CHECK(undeclared.out.find("output differs by") != std::string::npos);
  // Against the binary64 adapter, bit for bit in bf16: the same outputs
  // rounded once agree; truncated (one bf16 ULP below on about half the
  // elements) they differ.
  const Outcome agree = run("check --impl " + bf16 + " --against " + adapter("ring_cache.py") +
                            " --bitwise --cases 100 --seed 1 --out " + (dir / "agree").string());
  INFO(agree.out << agree.err);
  CHECK(agree.code == 0);
  CHECK(agree.out.find("outputs bit for bit in bf16 (the wider side rounded once): 100 cases") !=
        std::string::npos);
  const Outcome ulp =
      run("check --impl " + adapter("ring_cache.py", "--bug output-truncated") + " --against " +
          adapter("ring_cache.py") + " --bitwise --cases 100 --seed 1 --out " + (dir / "ulp").string());
  INFO(ulp.out << ulp.err);
  CHECK(ulp.code == 1);
  CHECK(ulp.out.find("not bitwise equal in bf16 (B rounded once into it") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("CLI exec: check --against an adapter's bug switch differs, shrunk small, and its replay reproduces it") {
  const fs::path dir = temp_dir("against");
  const std::string a = adapter("paged_cache.py"), b = adapter("paged_cache.py", "--bug free-early");
  const Outcome o = run("check --impl " + a + " --against " + b + " --cases 200 --seed 1 --out " + dir.string());
  INFO(o.out << o.err);
  CHECK(o.code == 1);
  CHECK(o.out.find("agreement of exec:") != std::string::npos);
  CHECK(o.out.find("first difference (A = exec:") != std::string::npos);
  const fs::path file = dir / "counterexample-agreement-seed1.json";
  REQUIRE(fs::exists(file));
  const auto sc = kvcheck::scenarios::load_scenario_file(file);
  CHECK(sc.requests.size() <= 3);
  CHECK(sc.steps.size() <= 8);
  // The printed replay command names both caches; run, it differs again; the
  // adapter against itself agrees on the same file.
  CHECK(o.out.find("replay: kvcheck replay " + file.string() + " --impl " + a + " --against " + b) !=
        std::string::npos);
  const Outcome again = run("replay " + file.string() + " --impl " + a + " --against " + b);
  CHECK(again.code == 1);
  CHECK(again.out.find("differs: ") != std::string::npos);
  CHECK(run("replay " + file.string() + " --impl " + a + " --against " + a).code == 0);
  // Two in-tree caches agree, and the pass says how much was compared.
  const Outcome pass = run("check --impl cpu --against layer --cases 100 --out " + (dir / "cpu").string());
  INFO(pass.out << pass.err);
  CHECK(pass.code == 0);
  CHECK(pass.out.find("0 failing") != std::string::npos);
  CHECK(pass.out.find("agreement of cpu (A) and layer (B), outputs within the larger tolerance: 100 cases, ") !=
        std::string::npos);
  // What cannot be run side by side is refused before any work, naming the flag.
  const Outcome bitwise = run("check --bitwise --out " + (dir / "x").string());
  CHECK(bitwise.code == 2);
  CHECK(bitwise.err.find("--bitwise") != std::string::npos);
  const Outcome shard = run("check --against layer --shard 0/2 --out " + (dir / "y").string());
  CHECK(shard.code == 2);
  CHECK(shard.err.find("--shard") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE(
    "CLI: the printed replay command, run through a shell, reproduces the run: --precision and --step-timeout "
    "travel, same failing step, same counts") {
  const fs::path dir = temp_dir("replay-command");
  struct Run {
    std::string name, impl, flags, expected;
  };
  // Options other than their defaults, each of which the replay command must
  // carry (before the option table it carried --impl and --fault only, and a
  // replay then ran at 113 bits with a 10 s timeout).
  const Run runs[] = {
      {"cpu", "cpu --fault ring-sized-window", "--cases 50 --precision 53 --step-timeout 7.5",
       "--impl cpu --fault ring-sized-window --precision 53 --step-timeout 7.5"},
      {"exec", adapter("ring_cache.py", "--bug zero-output"),
       "--cases 1 --threads 1 --precision 169 --step-timeout 30",
       "--impl " + adapter("ring_cache.py", "--bug zero-output") + " --precision 169 --step-timeout 30"}};
  for (const Run& r : runs) {
    INFO(r.name);
    const fs::path out = dir / r.name;
    const Outcome check = run("check --impl " + r.impl + " " + r.flags + " --out " + out.string());
    INFO(check.out << check.err);
    REQUIRE(check.code == 1);
    const auto at = check.out.find("replay: kvcheck replay ");
    REQUIRE(at != std::string::npos);
    const std::string printed =
        check.out.substr(at + 8, check.out.find('\n', at) - at - 8);  // "kvcheck replay ..."
    INFO(printed);
    CHECK(printed.size() > r.expected.size());
    CHECK(printed.compare(printed.size() - r.expected.size(), std::string::npos, r.expected) == 0);
    // The command as printed, through /bin/sh, with only the binary's path
    // put in for "kvcheck" and a report file added.
    const fs::path report = dir / (r.name + "-replay.json");
    const std::string command = std::string(KVCHECK_BINARY) + printed.substr(7) + " --report " +
                                report.string() + " >/dev/null 2>&1";
    const int status = std::system(command.c_str());
    CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 1);
    const auto checked = nlohmann::json::parse(slurp(out / "report.json"));
    const auto replayed = nlohmann::json::parse(slurp(report));
    REQUIRE(checked["runs"].size() == 1);
    REQUIRE(replayed["runs"].size() == 1);
    // The same run: failing step, first failure, every count, every step's
    // observations, and the reference's precision.
    const auto& a = checked["runs"][0];
    const auto& b = replayed["runs"][0];
    CHECK(b["verdict"] == "fail");
    CHECK(b["first_failing_step"] == a["first_failing_step"]);
    CHECK(b["first_failure"] == a["first_failure"]);
    CHECK(b["totals"] == a["totals"]);
    CHECK(b["precision_bits"] == a["precision_bits"]);
    CHECK(b == a);
    CHECK(replayed["context"]["precision_requested"] == checked["context"]["precision_requested"]);
  }
  fs::remove_all(dir);
}

TEST_CASE(
    "CLI exec: a misbehaving adapter ends the run with exit 2, the step, the JSON path, its stderr, no child "
    "left") {
  const std::string marker = "kvcheck-marker-" + std::to_string(::getpid());
  const std::string script = std::string(KVCHECK_SOURCE_DIR) + "/tests/cli/misbehaving_adapter.py";
  const std::pair<const char*, const char*> modes[] = {
      {"not-json", "steps[0] (prefill, layer 0) answer: the line is not JSON"},
      {"missing-field", "steps[0] (prefill, layer 0) answer.out: missing field"},
      {"wrong-shape", "steps[0] (prefill, layer 0) answer.out[0]: expected"},
      {"nan", "steps[0] (prefill, layer 0) answer: the line is not JSON (NaN and Infinity are not JSON;"},
      {"hang",
       "steps[0] (prefill, layer 0): no answer within 3 s (--step-timeout); the adapter is still running: if "
       "it wrote its answer, flush stdout"},
      {"bad-version", "hello answer.version: protocol version 2, kvcheck speaks 1"}};
  for (const auto& [mode, expected] : modes) {
    INFO(mode);
    const std::string check_args = "check --cases 3 --out " + (fs::temp_directory_path() / marker).string();
    for (const std::string& command : {check_args, std::string("replay")}) {
      const std::string file =
          std::string(KVCHECK_SOURCE_DIR) + "/scenarios/fast/prefill-w3-s5-store-then-load-4-6.json";
      const std::string args = command + (command == "replay" ? " " + file : "") +
                               // The hello shares the step's deadline: 3 s for the adapter that
                               // hangs (a Python start on a loaded machine can take over 1 s),
                               // generous for the others.
                               " --step-timeout " + (std::string(mode) == "hang" ? "3" : "60") +
                               " --impl 'exec:python3 " + script + " " + mode + " " +
                               marker + "'";
      const Outcome o = run(args);
      INFO(o.err);
      CHECK(o.code == 2);
      CHECK(o.err.rfind("kvcheck error 600 at ", 0) == 0);
      CHECK(o.err.find(expected) != std::string::npos);
      if (std::string(mode) == "hang") CHECK(o.err.find("adapter: thinking forever") != std::string::npos);
    }
  }
  // The hanging adapter started a grandchild: the whole process group is gone.
  // ("[k]" keeps pgrep from matching its own shell's command line.)
  CHECK(std::system(("pgrep -f '[k]" + marker.substr(1) + "' >/dev/null").c_str()) != 0);
}

TEST_CASE(
    "CLI exec: an adapter that crashes is a failing case, shrunk, its message in report.json, --case-seed "
    "reruns it, no child left") {
  const std::string marker = "kvcheck-crash-marker-" + std::to_string(::getpid());
  const fs::path dir = temp_dir("crash");
  const std::string impl = " --impl 'exec:python3 " + std::string(KVCHECK_SOURCE_DIR) +
                           "/tests/cli/misbehaving_adapter.py crash " + marker + "'";
  const Outcome o = run("check --cases 3 --out " + (dir / "a").string() + impl);
  INFO(o.out + o.err);
  REQUIRE(o.code == 1);
  const auto report = nlohmann::json::parse(slurp(dir / "a" / "report.json"));
  REQUIRE(report["runs"].size() == 1);
  const std::string failure = report["runs"][0]["first_failure"];
  CHECK(failure.find("layer 0: the cache crashed: the adapter closed its stdout (adapter exited with status 3)") !=
        std::string::npos);
  CHECK(failure.find("boom: simulated crash in the adapter") != std::string::npos);
  // Shrunk: the adapter crashes at the first step that writes rows, so one step is left.
  CHECK(report["runs"][0]["steps"].size() == 1);
  CHECK(o.out.find("(shrunk from ") != std::string::npos);
  // The printed rerun of the case as drawn fails the same way first.
  const std::string mark = "rerun the case as drawn: kvcheck check ";
  const std::size_t at = o.out.find(mark);
  REQUIRE(at != std::string::npos);
  const std::string rerun = o.out.substr(at + mark.size(), o.out.find('\n', at) - at - mark.size());
  CHECK(rerun.find("--case-seed " + std::to_string(report["check"]["failing_case_seed"].get<std::uint64_t>())) !=
        std::string::npos);
  const Outcome again = run("check " + rerun + " --out " + (dir / "b").string());
  INFO(again.out + again.err);
  CHECK(again.code == 1);
  CHECK(again.out.find("check: 1 cases") != std::string::npos);
  CHECK(again.out.find("coverage gate: off (--case-seed runs one case)") != std::string::npos);
  const auto second = nlohmann::json::parse(slurp(dir / "b" / "report.json"));
  CHECK(second["runs"][0]["first_failure"] == report["runs"][0]["first_failure"]);
  CHECK(second["check"]["failing_case_seed"] == report["check"]["failing_case_seed"]);
  CHECK(std::system(("pgrep -f '[k]" + marker.substr(1) + "' >/dev/null").c_str()) != 0);
  // --case-seed runs one case: not with --cases.
  CHECK(run("check --case-seed 5 --cases 3").code == 2);
  fs::remove_all(dir);
}

TEST_CASE("CLI: a small run without the coverage gate passes and says so, bash completes a flag") {
  const fs::path dir = temp_dir("small");
  CHECK(run("check --cases 1 --out " + (dir / "a").string()).code == 1);  // a class not reached
  const Outcome small = run("check --cases 1 --no-coverage-gate --out " + (dir / "b").string());
  CHECK(small.code == 0);
  CHECK(small.out.find("coverage gate: off (--no-coverage-gate)") != std::string::npos);
  const Outcome typo = run("chek --cases 1");
  CHECK(typo.code == 2);
  CHECK(typo.err.find("unknown command (try `kvcheck help`); did you mean check?") != std::string::npos);
  // The completion script loads in bash and completes a flag, a command and a listed value.
  const std::string script = (dir / "kvcheck.bash").string();
  const Outcome completion = run("completion bash");
  REQUIRE(completion.code == 0);
  std::ofstream(script) << completion.out;
  const auto complete = [&](const std::string& words, int cword) {
    const std::string cmd = "bash -c 'source " + script + " && COMP_WORDS=(" + words + ") && COMP_CWORD=" +
                            std::to_string(cword) + " && _kvcheck && echo \"${COMPREPLY[*]}\"' > " +
                            (dir / "reply").string();
    CHECK(std::system(cmd.c_str()) == 0);
    std::string reply = slurp(dir / "reply");
    while (!reply.empty() && reply.back() == '\n') reply.pop_back();
    return reply;
  };
  CHECK(complete("kvcheck check --no-cov", 2) == "--no-coverage-gate");
  CHECK(complete("kvcheck chec", 1) == "check");
  CHECK(complete("kvcheck check --profile prod", 3) == "production");
  fs::remove_all(dir);
}

TEST_CASE("CLI exec: same seed, same adapter, same report bytes") {
  const fs::path dir = temp_dir("exec-determinism");
  const std::string args =
      " --impl " + adapter("paged_cache.py", "--bug free-early") + " --cases 300 --seed 5 --threads 2 --out ";
  CHECK(run("check" + args + (dir / "a").string()).code == 1);
  CHECK(run("check" + args + (dir / "b").string()).code == 1);
  std::string a = slurp(dir / "a" / "report.json"), b = slurp(dir / "b" / "report.json");
  for (auto* s : {&a, &b}) {
    for (const char* d : {"/a", "/b"}) {
      const std::string needle = dir.string() + d;
      for (auto pos = s->find(needle); pos != std::string::npos; pos = s->find(needle))
        s->replace(pos, needle.size(), "<out>");
    }
  }
  CHECK(!a.empty());
  CHECK(a == b);
  fs::remove_all(dir);
}

TEST_CASE("CLI exec: sweep passes each capacity to the adapter, the ring adapter's minimum is the safe capacity's") {
  const Outcome o =
      run("sweep --impl " + adapter("ring_cache.py") +
          " --window 8,13 --drafts 0,2 --chunk 1,6 --order both --counterexamples none --json -");
  INFO(o.err);
  REQUIRE(o.code == 0);
  const auto j = nlohmann::json::parse(o.out);
  std::size_t rows = 0;
  for (const auto& row : j["rows"]) {
    ++rows;
    CHECK(row["min_safe_ring"] == row["spec_bound"]);
  }
  CHECK(rows == 16);
  // A cache that loses rows at every capacity is reported, exit 1.
  const Outcome bad = run("sweep --impl " + adapter("ring_cache.py", "--bug window-plus-one") +
                          " --window 8 --drafts 0 --chunk 1 --order store-then-load --counterexamples none");
  CHECK(bad.code == 1);
  CHECK(bad.err.find("lose rows at every capacity tried") != std::string::npos);
}

TEST_CASE(
    "CLI: check and replay reach the layer-bound cache, unsupported scenarios are skipped with the reason") {
  const fs::path dir = temp_dir("layer");
  const Outcome o = run("check --impl layer --cases 500 --out " + dir.string());
  INFO(o.out << o.err);
  CHECK(o.code == 0);
  // A class it cannot reach (no window slides: no ring wrap) is not listed
  // or gated; the features it declares are, and nothing it lacks (no verify).
  CHECK(o.out.find("ring_wrap") == std::string::npos);
  CHECK(o.out.find("features (cases exercising each declared feature): finish=") != std::string::npos);
  CHECK(o.out.find("verify=") == std::string::npos);
  const Outcome r =
      run("replay --impl layer " + std::string(KVCHECK_SOURCE_DIR) + "/scenarios/fast/verify-s128.json");
  // Its only scenario skipped, the replay ran nothing: that is no pass.
  CHECK(r.code == 1);
  CHECK(r.out.find("FAIL: 1 run: no run ran, 0 refused, 1 skipped") != std::string::npos);
  CHECK(r.out.find("SKIP  verify-s128  (layer-kv-cache does not support steps of 100 rows (most 1))") !=
        std::string::npos);
  CHECK(run("check --impl layer --fault window-too-wide --cases 5").code == 2);
  fs::remove_all(dir);
}

TEST_CASE("CLI: stray positional arguments and an unusable --out are refused before any work") {
  for (const char* args :
       {"check 500", "spec extra", "faults x", "trace --window 3 --ring 5 --state 0 --positions 1 extra",
        "sweep 7", "demo now"}) {
    INFO(args);
    const Outcome o = run(args);
    CHECK(o.code == 2);
    CHECK(o.err.find("takes no positional arguments") != std::string::npos);
    CHECK(lines(o.err) == 1);
  }
  const fs::path dir = temp_dir("bad-out");
  std::ofstream(dir / "file") << "x";
  const Outcome o = run("check --cases 100000 --out " + (dir / "file" / "sub").string());
  CHECK(o.code == 2);
  CHECK(o.err.rfind("kvcheck error 400 at --out: cannot create directory", 0) == 0);
  CHECK(o.out.empty());  // refused before the first case
  fs::remove_all(dir);
}

TEST_CASE("CLI: --max-failures stops at the N-th failing case and says so, and is refused with --shard") {
  const fs::path dir = temp_dir("max-failures");
  const std::string common = "check --fault window-too-narrow --cases 400 --seed 3 ";
  const Outcome all = run(common + "--out " + (dir / "all").string());
  CHECK(all.code == 1);
  const auto full = nlohmann::json::parse(slurp(dir / "all" / "report.json"))["check"];
  REQUIRE(full["failures"].get<std::int64_t>() > 2);
  CHECK_FALSE(full.contains("stopped"));
  const auto seeds = full["failing_case_seeds"];
  for (const char* threads : {"1", "3"}) {
    INFO("threads " << threads);
    const fs::path out = dir / threads;
    const Outcome o = run(common + "--max-failures 2 --threads " + threads + " --out " + out.string());
    INFO(o.out << o.err);
    CHECK(o.code == 1);
    const auto check = nlohmann::json::parse(slurp(out / "report.json"))["check"];
    CHECK(check["failures"] == 2);
    CHECK(check["failing_case_seeds"] == nlohmann::json::array({seeds[0], seeds[1]}));
    CHECK(check["failing_case_seed"] == full["failing_case_seed"]);
    const std::int64_t cases = check["cases"].get<std::int64_t>();
    CHECK(check["stopped"]["max_failures"] == 2);
    CHECK(check["stopped"]["cases_not_run"].get<std::int64_t>() == 400 - cases);
    CHECK(o.out.find("stopped after 2 failing cases (--max-failures): the first " + std::to_string(cases) +
                     " cases counted, " + std::to_string(400 - cases) + " not run") != std::string::npos);
    // The same counterexample as the run of every case.
    CHECK(slurp(out / "counterexample-window-too-narrow-seed3.json") ==
          slurp(dir / "all" / "counterexample-window-too-narrow-seed3.json"));
  }
  const Outcome shard = run(common + "--max-failures 2 --shard 0/2 --out " + (dir / "shard").string());
  CHECK(shard.code == 2);
  CHECK(shard.err.rfind("kvcheck error 100 at --max-failures:", 0) == 0);
  CHECK(run(common + "--max-failures 0").code == 2);
  fs::remove_all(dir);
}

TEST_CASE("CLI: COMMAND --help prints that command's usage, --version the version") {
  for (const char* command :
       {"demo", "spec", "check", "replay", "audit", "trace", "sweep", "faults", "merge"}) {
    INFO(command);
    const Outcome o = run(std::string(command) + " --help");
    CHECK(o.code == 0);
    CHECK(o.out.rfind("usage:\n  kvcheck " + std::string(command), 0) == 0);
    CHECK(o.out.find("exit codes:") != std::string::npos);
  }
  const Outcome v = run("--version");
  CHECK(v.code == 0);
  CHECK(v.out.rfind("kvcheck ", 0) == 0);
  CHECK(run("nope --help").code == 2);
  CHECK(run("help check").out == run("check --help").out);
  CHECK(run("help nope").code == 2);

  // docs/usage.md's usage block is what `kvcheck help` prints as its usage
  // lines (both come from cli/usage.cpp's command table).
  const Outcome help = run("help");
  CHECK(help.code == 0);
  const std::size_t from = help.out.find("\nusage:\n");
  REQUIRE(from != std::string::npos);
  const std::string printed = help.out.substr(from + 8, help.out.find("\n\n", from + 8) + 1 - (from + 8));
  const std::string doc = slurp(fs::path(KVCHECK_SOURCE_DIR) / "docs/usage.md");
  const std::size_t block = doc.find("```text\n");
  REQUIRE(block != std::string::npos);
  const std::string documented = doc.substr(block + 8, doc.find("```", block + 8) - (block + 8));
  CHECK(documented == printed);
  CHECK(run("").out.empty());  // no arguments: the usage on stderr, exit 2
  CHECK(run("").err == help.out);
  CHECK(run("").code == 2);

  // The man page: man(7) macros, and groff (when installed) reads it without a warning.
  const Outcome man = run("help --man");
  CHECK(man.code == 0);
  CHECK(man.out.rfind(".TH KVCHECK 1 ", 0) == 0);
  if (std::system("command -v groff >/dev/null 2>&1") == 0) {
    const fs::path dir = temp_dir("man");
    std::ofstream(dir / "kvcheck.1") << man.out;
    const std::string cmd = "groff -man -Tutf8 -ww " + (dir / "kvcheck.1").string() + " >" +
                            (dir / "out").string() + " 2>" + (dir / "err").string();
    CHECK(std::system(cmd.c_str()) == 0);
    CHECK(slurp(dir / "err").empty());
    CHECK(slurp(dir / "out").find("--step-timeout") != std::string::npos);
    fs::remove_all(dir);
  }
}

TEST_CASE(
    "CLI: runs whose estimated memory exceeds the limit are refused in under a second with the driving "
    "field") {
  const fs::path dir = temp_dir("memory");
  const std::string good = slurp(fs::path(KVCHECK_SOURCE_DIR) / "scenarios/fast/verify-s133.json");
  auto with = [&good](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto pos = s.find(from);
    REQUIRE(pos != std::string::npos);
    return s.replace(pos, from.size(), to);
  };
  struct Case {
    std::string name, text, limit, where;
  };
  const Case cases[] = {
      // 2^28 rows: about 26 GB of pool, more than this limit and than most machines have.
      {"ring", with("\"ring_rows\": 133", "\"ring_rows\": 268435456"), "4G", "cache.ring_rows"},
      {"layers", with("\"layers\": 1", "\"layers\": 100000"), "1G", "cache.layers"},
  };
  const fs::path report = dir / "report.json";
  std::ofstream(report) << "before";
  for (const Case& c : cases) {
    INFO(c.name);
    const fs::path file = dir / (c.name + ".json");
    std::ofstream(file) << c.text;
    const auto start = std::chrono::steady_clock::now();
    const Outcome o =
        run("replay " + file.string() + " --memory-limit " + c.limit + " --report " + report.string());
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 1.0);
    CHECK(o.code == 2);
    CHECK(lines(o.err) == 1);
    CHECK(o.err.rfind("kvcheck error 302 at " + c.where + ": the run needs an estimated ", 0) == 0);
    CHECK(o.err.find("--memory-limit") != std::string::npos);
    CHECK(o.out.empty());
    CHECK(slurp(report) == "before");  // files are left as they were
  }
  // check: the estimate is per worker thread, never per case.
  const Outcome many =
      run("check --cases 100000000 --threads 256 --memory-limit 64M --out " + (dir / "out").string());
  CHECK(many.code == 2);
  CHECK(many.err.rfind("kvcheck error 302 at --threads: ", 0) == 0);
  CHECK_FALSE(fs::exists(dir / "out"));
  for (const char* bad : {"0", "12X", "-5", "G"}) {
    INFO(bad);
    const Outcome o = run(std::string("check --memory-limit ") + bad);
    CHECK(o.code == 2);
    CHECK(o.err.rfind("kvcheck error 100 at --memory-limit: ", 0) == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE("CLI: check --profile production runs production cases, an unknown profile is exit 2") {
  const fs::path dir = temp_dir("profile");
  const Outcome o = run("check --profile production --cases 12 --seed 2 --out " + (dir / "a").string());
  CHECK(o.code <= 1);  // 12 cases may miss a rare coverage class (exit 1); none fails
  CHECK(o.out.find("0 failing") != std::string::npos);
  CHECK(o.out.find("profile production") != std::string::npos);
  CHECK(o.out.find("fast_cpu_kernel=") != std::string::npos);
  const Outcome bad = run("check --profile huge");
  CHECK(bad.code == 2);
  CHECK(bad.err ==
        "kvcheck error 100 at --profile: must be default, production, trim, layers, prefix or paged, got 'huge'\n");
  fs::remove_all(dir);
}
