#include "cli/usage.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "properties/option_table.hpp"
#include "support/error.hpp"

namespace kvcheck::cli {

namespace {

constexpr std::size_t kWidth = 110;    // columns of the usage text
constexpr std::size_t kNameWidth = 7;  // "replay" and a blank: arguments start in one column

constexpr const char* kTitle = "verify LLM attention KV caches against a high-precision reference";

/// The notes below the usage lines, one paragraph each.
constexpr const char* kImplNote =
    "IMPL: cpu (default), cuda, layer (the layer-bound cache), or exec:'COMMAND ARGS' (an engine's adapter "
    "speaking the JSON Lines protocol of adapters/PROTOCOL.md)";
constexpr const char* kShardNote =
    "--shard I/N runs the cases (check) or columns (sweep) whose index is I mod N and writes DIR/shard.json; "
    "`kvcheck merge` writes the whole run's report, byte for byte one process's; it runs no command from a "
    "shard document: a failing case is re-run on merge's own --impl, which must be the shards' engine. Under "
    "`mpirun -n R` (an MPI build) each rank runs one shard and rank 0 writes the report.";
constexpr const char* kHelpNote =
    "`kvcheck COMMAND --help` prints one command's usage; `kvcheck --version` the version; `kvcheck help "
    "--man` the man page.";

/// The exit codes, as the usage and the man page list them.
constexpr std::pair<int, const char*> kExitCodes[] = {
    {0, "all properties hold"},
    {1, "a property failed"},
    {2, "bad usage or input"},
    {3, "an internal error"},
};

/// The flags of check (kForCheck) or replay (kForReplay): the option table's rows.
std::vector<FlagSpec> option_table_flags(unsigned command) {
  std::vector<FlagSpec> flags;
  for (const properties::OptionRow& row : properties::kCheckOptions) {
    if (row.commands & command) flags.push_back({std::string(row.flag), std::string(row.value)});
  }
  return flags;
}

std::vector<CommandSpec> make_table() {
  return {
      {"demo",
       "",
       {{"--cases", "N"}, {"--seed", "X"}, {"--out", "DIR"}, {"--scenarios", "DIR"}},
       "the main job: golden values, bundled scenarios, a check, a sweep, a live adapter and an audit; "
       "writes report.html"},
      {"spec", "", {}, "recompute the golden values with the reference model"},
      {"check", "", option_table_flags(properties::kForCheck),
       "randomized schedules on one cache; a shrunk counterexample on failure"},
      {"replay", "FILE|DIR...", option_table_flags(properties::kForReplay),
       "run scenario files (a counterexample, the bundled ones)"},
      {"audit",
       "TRACE|DIR...",
       {{"--report", "FILE"},
        {"--junit", "FILE"},
        {"--html", "FILE"},
        {"--text", "FILE"},
        {"--precision", "53|113|169"},
        {"--memory-limit", "BYTES"}},
       "judge the recorded traces of an engine"},
      {"trace",
       "",
       {{"--window", "W", true},
        {"--ring", "S", true},
        {"--state", "B", true},
        {"--positions", "P1,P2,...", true},
        {"--json", ""}},
       "print the ring addressing table"},
      {"sweep",
       "",
       {{"--window", "A[:B[:STEP]]"},
        {"--drafts", "K1[:K2]"},
        {"--chunk", "C1[:C2]"},
        {"--order", "store-then-load|load-then-store|both"},
        {"--states", "N"},
        {"--json", "FILE"},
        {"--csv", "FILE"},
        {"--svg", "FILE"},
        {"--formula", "EXPR"},
        {"--out", "DIR"},
        {"--counterexamples", "auto|all|none"},
        {"--threads", "T"},
        {"--impl", "layer|exec:CMD"},
        {"--step-timeout", "S"},
        {"--shard", "I/N"},
        {"--memory-limit", "BYTES"}},
       "find the smallest safe ring per configuration"},
      {"merge",
       "SHARD_DIR...",
       {{"--impl", "IMPL"},
        {"--out", "DIR"},
        {"--json", "FILE"},
        {"--csv", "FILE"},
        {"--svg", "FILE"},
        {"--memory-limit", "BYTES"}},
       "join the shards of a check or sweep into its report"},
      {"faults", "", {}, "list the named faults"},
  };
}

/// A command's arguments as the usage shows them: the positional ones, then
/// each flag ("--flag VALUE", in brackets unless required).
std::vector<std::string> synopsis_items(const CommandSpec& command) {
  std::vector<std::string> items;
  if (!command.positional.empty()) items.push_back(command.positional);
  for (const FlagSpec& f : command.flags) {
    const std::string item = f.value.empty() ? f.flag : f.flag + " " + f.value;
    items.push_back(f.required ? item : "[" + item + "]");
  }
  return items;
}

/// `words` joined by blanks into lines of at most kWidth columns: the first
/// starts with `first`, the others with `indent`.
std::string wrap(const std::vector<std::string>& words, const std::string& first, const std::string& indent) {
  std::string out, line = first;
  bool empty = true;  // no word on `line` yet
  for (const std::string& w : words) {
    if (!empty && line.size() + 1 + w.size() > kWidth) {
      out += line + "\n";
      line = indent;
      empty = true;
    }
    if (!empty) line += " ";
    line += w;
    empty = false;
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return out + line + "\n";
}

/// The words of `text`, split at blanks outside `backquotes` (a quoted
/// command stays on one line).
std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool quoted = false;
  for (const char c : text) {
    if (c == ' ' && !quoted) {
      if (!word.empty()) words.push_back(word);
      word.clear();
      continue;
    }
    if (c == '`') quoted = !quoted;
    word += c;
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

std::string paragraph(const std::string& text) {
  return wrap(split_words(text), "", "");
}

std::string exit_code_line() {
  std::string line = "exit codes:";
  for (std::size_t i = 0; i < std::size(kExitCodes); ++i) {
    line += (i == 0 ? " " : ", ") + std::to_string(kExitCodes[i].first) + " " + kExitCodes[i].second;
  }
  return line;
}

bool takes(const CommandSpec& command, const std::string& flag) {
  return std::any_of(command.flags.begin(), command.flags.end(),
                     [&](const FlagSpec& f) { return f.flag == flag; });
}

/// `text` for troff: backslashes and hyphens escaped, a leading '.' or '\''
/// kept as text.
std::string roff(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\\')
      out += "\\e";
    else if (c == '-')
      out += "\\-";
    else
      out += c;
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out = "\\&" + out;
  return out;
}

}  // namespace

std::set<std::string> CommandSpec::value_flags() const {
  std::set<std::string> out;
  for (const FlagSpec& f : flags)
    if (!f.value.empty()) out.insert(f.flag);
  return out;
}

std::set<std::string> CommandSpec::bool_flags() const {
  std::set<std::string> out;
  for (const FlagSpec& f : flags)
    if (f.value.empty()) out.insert(f.flag);
  return out;
}

const std::vector<CommandSpec>& command_table() {
  static const std::vector<CommandSpec> table = make_table();
  return table;
}

const CommandSpec* find_command(std::string_view name) {
  for (const CommandSpec& c : command_table())
    if (c.name == name) return &c;
  return nullptr;
}

Args command_args(int argc, char** argv, std::string_view name) {
  const CommandSpec* command = find_command(name);
  if (command == nullptr) {
    throw Error(ErrorId::kInternal, std::string(name), "command missing from the command table");
  }
  return Args(argc, argv, 2, command->value_flags(), command->bool_flags());
}

std::string command_synopsis(const CommandSpec& command) {
  std::string head = "  kvcheck " + command.name + " ";
  head.resize(std::max(head.size(), 2 + 8 + kNameWidth), ' ');
  return wrap(synopsis_items(command), head, std::string(head.size(), ' '));
}

std::string usage_text() {
  std::string out = std::string("kvcheck: ") + kTitle + "\n\ncommands:\n";
  for (const CommandSpec& c : command_table()) {
    std::string head = "  " + c.name + " ";
    head.resize(std::max(head.size(), 2 + kNameWidth + 1), ' ');
    out += wrap(split_words(c.summary), head, std::string(head.size(), ' '));
  }
  out += "\nusage:\n";
  for (const CommandSpec& c : command_table()) out += command_synopsis(c);
  out += "\n" + paragraph(kImplNote) + "\n" + paragraph(kShardNote) + "\n" + paragraph(exit_code_line()) +
         paragraph(kHelpNote);
  return out;
}

std::string command_usage_text(const CommandSpec& command) {
  std::string out = "usage:\n" + command_synopsis(command) + "\n" + paragraph(command.summary) + "\n";
  if (takes(command, "--impl")) out += paragraph(kImplNote) + "\n";
  if (takes(command, "--shard")) out += paragraph(kShardNote) + "\n";
  return out + paragraph(exit_code_line());
}

std::string man_page(std::string_view version) {
  std::string out = ".TH KVCHECK 1 \"\" \"kvcheck " + roff(std::string(version)) + "\" \"User Commands\"\n";
  out += ".SH NAME\nkvcheck \\- " + roff(kTitle) + "\n";
  out += ".SH SYNOPSIS\n.B kvcheck\n.I COMMAND\n[\\fIARGUMENTS\\fR]\n";
  out += ".br\n.B kvcheck\n.I COMMAND\n.B \\-\\-help\n";
  out += ".br\n.B kvcheck help\n[\\fB\\-\\-man\\fR]\n";
  out += ".SH COMMANDS\n";
  for (const CommandSpec& c : command_table()) {
    out += ".TP\n.B kvcheck " + roff(c.name) + "\n";
    // One argument never breaks across lines: its blanks are unbreakable ("\ ").
    std::string args;
    for (const std::string& item : synopsis_items(c)) {
      std::string text = roff(item);
      for (std::size_t at = text.find(' '); at != std::string::npos; at = text.find(' ', at + 2)) {
        text.replace(at, 1, "\\ ");
      }
      args += (args.empty() ? "" : " ") + text;
    }
    if (!args.empty()) out += args + "\n.br\n";
    out += roff(c.summary) + "\n";
  }
  out += ".SH NOTES\n" + roff(kImplNote) + "\n.PP\n" + roff(kShardNote) + "\n.PP\n" + roff(kHelpNote) + "\n";
  out += ".SH EXIT STATUS\n";
  for (const auto& [code, meaning] : kExitCodes)
    out += ".TP\n.B " + std::to_string(code) + "\n" + roff(meaning) + "\n";
  out +=
      ".SH SEE ALSO\nThe documents of the kvcheck source tree: README.md, docs/usage.md (this usage with "
      "examples), adapters/PROTOCOL.md (the exec protocol).\n";
  return out;
}

}  // namespace kvcheck::cli
