// cli/usage: the one table of commands. Every flag a command's parser accepts
// is in its usage and every flag in its usage is accepted; check and replay
// take exactly the option table's flags; the usage fits its width; the man
// page carries the man(7) sections, one .TP per command.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/progress.hpp"
#include "cli/usage.hpp"
#include "properties/option_table.hpp"
#include "support/error.hpp"

using namespace kvcheck;
using namespace kvcheck::cli;

namespace {

/// command_args for `command` over `words`.
Args parse(const std::string& command, std::vector<std::string> words) {
  words.insert(words.begin(), {"kvcheck", command});
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return command_args(static_cast<int>(argv.size()), argv.data(), command);
}

/// The flags ("--x") named in the usage lines of `help` (from "usage:" to
/// the first blank line).
std::set<std::string> usage_flags(const std::string& help) {
  std::istringstream in(help);
  std::string line;
  std::getline(in, line);
  REQUIRE(line == "usage:");
  std::set<std::string> flags;
  while (std::getline(in, line) && !line.empty()) {
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      const std::size_t at = w.find("--");
      if (at == std::string::npos) continue;
      std::size_t end = at + 2;
      while (end < w.size() && (std::isalnum(static_cast<unsigned char>(w[end])) || w[end] == '-')) ++end;
      flags.insert(w.substr(at, end - at));
    }
  }
  return flags;
}

}  // namespace

TEST_CASE("Usage: each command's --help lists exactly the flags its parser accepts") {
  const std::vector<std::string> names = {"demo",  "spec",  "check", "replay", "audit",
                                          "trace", "sweep", "merge", "faults", "completion"};
  REQUIRE(command_table().size() == names.size());
  for (const std::string& name : names) {
    INFO(name);
    const CommandSpec* command = find_command(name);
    REQUIRE(command != nullptr);
    std::set<std::string> accepted = command->value_flags();
    for (const auto& f : command->bool_flags()) accepted.insert(f);
    CHECK(usage_flags(command_usage_text(*command)) == accepted);
    for (const auto& f : command->value_flags()) {
      INFO(f);
      CHECK(parse(name, {f, "1"}).get(f) == "1");
    }
    for (const auto& f : command->bool_flags()) {
      INFO(f);
      CHECK(parse(name, {f}).has(f));
    }
    // A flag of no command is refused, naming the flag.
    try {
      parse(name, {"--no-such-flag"});
      FAIL("accepted --no-such-flag");
    } catch (const Error& e) {
      CHECK(e.id() == ErrorId::kUsage);
      CHECK(e.where() == "--no-such-flag");
    }
  }
  // check and replay: the option table's flags, a value or none as it says.
  CHECK(find_command("check")->value_flags() == properties::option_flags(properties::kForCheck, false));
  CHECK(find_command("check")->bool_flags() == properties::option_flags(properties::kForCheck, true));
  CHECK(find_command("replay")->value_flags() == properties::option_flags(properties::kForReplay, false));
  CHECK(find_command("replay")->bool_flags() == properties::option_flags(properties::kForReplay, true));
  CHECK(find_command("check")->bool_flags() ==
        std::set<std::string>{"--bitwise", "--no-coverage-gate", "--repeat-bitwise"});
  // A required flag is shown bare, an optional one in brackets.
  const std::string trace = command_synopsis(*find_command("trace"));
  CHECK(trace.find(" --window W ") != std::string::npos);
  CHECK(trace.find("[--json]") != std::string::npos);
  CHECK(find_command("nope") == nullptr);
}

TEST_CASE("Usage: the help text fits 110 columns and keeps its notes, the man page has its sections") {
  const std::string help = usage_text();
  std::istringstream in(help);
  std::string line;
  std::size_t synopsis_lines = 0;
  while (std::getline(in, line)) {
    INFO(line);
    CHECK(line.size() <= 110);
    CHECK((line.empty() || line.back() != ' '));
    synopsis_lines += line.rfind("  kvcheck ", 0) == 0;
  }
  CHECK(synopsis_lines == command_table().size());
  for (const char* note :
       {"\nIMPL: cpu (default)", "\n--shard I/N runs", "\nexit codes: 0 all properties hold"}) {
    CHECK(help.find(note) != std::string::npos);
  }
  CHECK(command_usage_text(*find_command("check")).find("\n--shard I/N") != std::string::npos);
  CHECK(command_usage_text(*find_command("trace")).find("IMPL:") == std::string::npos);

  const std::string man = man_page("1.2.3");
  CHECK(man.rfind(".TH KVCHECK 1 \"\" \"kvcheck 1.2.3\"", 0) == 0);
  for (const char* section : {"\n.SH NAME\nkvcheck \\- ", "\n.SH SYNOPSIS\n", "\n.SH COMMANDS\n",
                              "\n.SH EXIT STATUS\n", "\n.SH SEE ALSO\n"}) {
    CHECK(man.find(section) != std::string::npos);
  }
  std::size_t entries = 0;
  for (std::size_t at = man.find(".TP\n.B kvcheck "); at != std::string::npos;
       at = man.find(".TP\n.B kvcheck ", at + 1))
    ++entries;
  CHECK(entries == command_table().size());
  CHECK(man.find("[\\-\\-step\\-timeout\\ S]") !=
        std::string::npos);  // hyphens escaped, the blank unbreakable
  std::istringstream lines(man);
  while (std::getline(lines, line)) {
    INFO(line);
    CHECK((line.empty() || line[0] != '\''));
    // Every hyphen escaped, so man prints a minus sign a reader can copy.
    for (std::size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '-') CHECK((i > 0 && line[i - 1] == '\\'));
    }
  }
}

TEST_CASE("Usage: every flag has its help, printed under the command's --help and in the man page") {
  for (const CommandSpec& c : command_table()) {
    INFO(c.name);
    const std::string help = command_usage_text(c);
    if (!c.flags.empty()) CHECK(help.find("\nflags:\n") != std::string::npos);
    for (const FlagSpec& f : c.flags) {
      INFO(f.flag);
      CHECK_FALSE(f.help.empty());
      // "  --flag VALUE" starts a line of the flags section, its help beside it.
      const std::string head = "\n  " + (f.value.empty() ? f.flag : f.flag + " " + f.value);
      const std::size_t at = help.find(head + " ");
      const std::size_t wrapped = help.find(head + "\n");
      CHECK((at != std::string::npos || wrapped != std::string::npos));
      const std::string first_word = f.help.substr(0, f.help.find(' '));
      CHECK(help.find(first_word, std::min(at, wrapped)) != std::string::npos);
    }
    std::istringstream in(help);
    std::string line;
    while (std::getline(in, line)) {
      INFO(line);
      CHECK(line.size() <= 110);
    }
  }
  const std::string check = command_usage_text(*find_command("check"));
  CHECK(check.find("--cases N") != std::string::npos);
  CHECK(check.find("(default 200)") != std::string::npos);
  CHECK(check.find("53, 113 (default) or 169") != std::string::npos);
  CHECK(man_page("1").find(".B \\-\\-no\\-coverage\\-gate\n") != std::string::npos);
}

TEST_CASE("Usage: did you mean names the one nearest flag or command, and nothing when none is near") {
  const std::vector<std::string> flags = {"--cases", "--case-seed", "--seed", "--no-coverage-gate", "--out"};
  CHECK(closest_name("--cses", flags) == "--cases");
  CHECK(closest_name("--seeds", flags) == "--seed");
  CHECK(closest_name("--no-cov", flags) == "--no-coverage-gate");  // the only one it begins
  CHECK(closest_name("--case", flags) == "--cases");              // one edit beats a prefix
  CHECK(closest_name("--xyzzy", flags).empty());
  CHECK(closest_name("chek", {"check", "spec", "sweep"}) == "check");
  try {
    parse("check", {"--cses", "3"});
    FAIL("accepted --cses");
  } catch (const Error& e) {
    CHECK(e.where() == "--cses");
    CHECK(e.rule().find("did you mean --cases?") != std::string::npos);
  }
  // An adapter command that was not quoted: the fix is in the message.
  for (const std::vector<std::string>& words :
       {std::vector<std::string>{"--impl", "exec:python3", "adapters/ring_cache.py", "--cases", "3"},
        std::vector<std::string>{"--impl=exec:python3", "adapters/ring_cache.py"}}) {
    try {
      parse("check", words).no_positional("check");
      FAIL("accepted an unquoted adapter command");
    } catch (const Error& e) {
      CHECK(e.where() == "adapters/ring_cache.py");
      CHECK(e.rule().find("looks unquoted") != std::string::npos);
      CHECK(e.rule().find("--impl 'exec:python3 adapters/ring_cache.py'") != std::string::npos);
    }
  }
  try {
    parse("check", {"--impl", "exec:python3", "adapters/paged_cache.py", "--bug", "free-early"});
    FAIL("accepted --bug");
  } catch (const Error& e) {
    CHECK(e.where() == "--bug");
    CHECK(e.rule().find("--impl 'exec:python3 adapters/paged_cache.py --bug free-early'") != std::string::npos);
  }
  try {
    parse("check", {"-n", "5"}).no_positional("check");
    FAIL("accepted -n");
  } catch (const Error& e) {
    CHECK(e.where() == "-n");
    CHECK(e.rule().find("long ones") != std::string::npos);
  }
}

TEST_CASE("Usage: the bash completion lists every command and each command's flags and listed values") {
  const std::string script = bash_completion();
  CHECK(script.find("complete -F _kvcheck kvcheck\n") != std::string::npos);
  for (const CommandSpec& c : command_table()) {
    INFO(c.name);
    CHECK(script.find(" " + c.name) != std::string::npos);
    for (const FlagSpec& f : c.flags) CHECK(script.find(" " + f.flag) != std::string::npos);
  }
  CHECK(script.find("check:--profile) COMPREPLY=($(compgen -W 'default production") != std::string::npos);
}

TEST_CASE("Progress: the line shows done of total, the rate, the time left and the time so far") {
  CHECK(progress_text("check", 50, 200, 10.0) ==
        "check [#######.......................] 50/200, 5.0/s, about 30 s left (10 s)");
  // Before the first case is done there is no rate yet; the time still moves.
  CHECK(progress_text("check", 0, 200, 3.0) == "check [..............................] 0/200 (3 s)");
  CHECK(progress_text("sweep", 4, 4, 2.0) == "sweep [##############################] 4/4, 2.0/s, about 0 s left (2 s)");
}
