// cli/usage: the one table of commands. Every flag a command's parser accepts
// is in its usage and every flag in its usage is accepted; check and replay
// take exactly the option table's flags; the usage fits its width; the man
// page carries the man(7) sections, one .TP per command.
#include <catch2/catch.hpp>

#include <cctype>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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
                                          "trace", "sweep", "merge", "faults"};
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
  // check and replay: the option table's flags, all of them taking a value.
  CHECK(find_command("check")->value_flags() == properties::option_flags(properties::kForCheck));
  CHECK(find_command("replay")->value_flags() == properties::option_flags(properties::kForReplay));
  CHECK(find_command("check")->bool_flags().empty());
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
