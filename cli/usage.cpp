#include "cli/usage.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string_view>
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
    "IMPL: cpu (default), cuda, paged (the CPU ring pool over a block table of 4-row blocks), layer (the "
    "layer-bound cache), or exec:'COMMAND ARGS' (an engine's adapter speaking the JSON Lines protocol of "
    "adapters/PROTOCOL.md)";
constexpr const char* kShardNote =
    "--shard I/N runs the cases (check) or columns (sweep) whose index is I mod N and writes DIR/shard.json; "
    "`kvcheck merge` writes the whole run's report, byte for byte one process's; it runs no command from a "
    "shard document: a failing case is re-run on the shards' built-in cache (cpu, cuda, paged, layer), or on "
    "merge's own --impl for an exec: engine (--impl, when given, must be the shards' engine). Under "
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

/// What each flag does, with its default and values: {command, flag, help},
/// command "" for every command that takes the flag (a command's own row
/// comes first). Every flag of the table has a row (tests/cli/usage_test.cpp).
struct FlagHelp {
  const char* command;
  const char* flag;
  const char* help;
};
constexpr FlagHelp kFlagHelp[] = {
    {"", "--impl", "the cache under test (default cpu; IMPL below)"},
    {"", "--fault", "a named fault planted in the cache (default none; `kvcheck faults` lists them)"},
    {"", "--against",
     "a second cache (IMPL) that runs every case beside --impl; the check fails at every step where what the "
     "two hold (resident rows), read or output differs (outputs beyond the larger of their tolerances), and "
     "shrinks the difference; the second cache runs without --fault"},
    {"", "--bitwise", "with --against: outputs must be equal bit for bit"},
    {"", "--repeat-bitwise",
     "every case runs twice on fresh caches of --impl (one provider, one adapter process); the two runs must "
     "agree and give bitwise-equal outputs (its own property, repeat-bitwise)"},
    {"", "--precision", "significand bits of the reference: 53, 113 (default) or 169"},
    {"", "--step-timeout", "seconds an exec adapter has for each answer (default 10)"},
    {"", "--exec-encoding",
     "how rows and outputs travel to and from an exec adapter: json (default) or binary (little-endian "
     "frames, offered at hello; JSON if the adapter declines); the same verdicts and reports either way"},
    {"", "--reference",
     "how the 113- and 169-bit reference is computed: certified (default; MPFR only where needed) or mpfr "
     "(every query); the same figures either way"},
    {"", "--cases", "generated cases to run (default 200)"},
    {"", "--seed", "the run's seed: the same seed draws the same cases (default 1)"},
    {"", "--case-seed",
     "run only the one case this case seed draws (a failing check prints it), with no coverage gate; not "
     "with --cases"},
    {"", "--profile",
     "the distribution cases are drawn from: default (small shapes), production, trim (the default's "
     "cases with trims, for a cache that declares trim), layers (the default's cases with a window per "
     "layer, sliding and global, for a cache that declares per_layer_windows), prefix (the default's cases "
     "with requests begun from shared prefixes, for a cache that declares prefix_sharing), or paged (cases "
     "that cross many block boundaries: windows of 1..3 blocks, long and short requests, finishes and "
     "verifies; the summary counts block frees and reuses)"},
    {"", "--min-run-share",
     "the share of cases that must run (neither refused nor skipped) for a pass, 0..1 (default 0.8)"},
    {"", "--no-coverage-gate",
     "a coverage class no case reached does not fail the check (a small run meant as such); the summary "
     "says the gate is off"},
    {"", "--max-failures",
     "stop drawing cases once N have failed: the check counts the cases up to its N-th failing one (the "
     "same whatever --threads), shrinks as usual and says how many cases did not run; not with --shard "
     "(default: every case runs)"},
    {"", "--memory-limit",
     "refuse to start when the estimated memory exceeds BYTES (K, M, G suffixes; default: the memory "
     "available)"},
    {"", "--work-limit",
     "refuse to start when the estimated work exceeds ROWS (K, M, G suffixes, powers of 1024): the rows the "
     "reference reads (every query's visible rows in one layer, all runs) for check, replay and audit, the "
     "probe rows for sweep (default: no limit; work over 4M reads is announced on stderr with its memory "
     "estimate and shown with a progress line on a terminal)"},
    {"check", "--record", "also write the trace of one run (the counterexample, else case 0) to TRACE"},
    {"replay", "--record", "also write the runs as a trace to TRACE"},
    {"", "--threads", "worker threads (default 2)"},
    {"", "--shard", "run only the cases whose index is I mod N and write DIR/shard.json (below)"},
    {"check", "--out", "where the report set and the counterexample go (default kvcheck-out)"},
    {"demo", "--out", "where report.html and the other reports go (default kvcheck-out)"},
    {"sweep", "--out", "where counterexamples go (default kvcheck-out/sweep)"},
    {"merge", "--out", "where the merged reports go (default kvcheck-out; a sweep's: kvcheck-out/sweep)"},
    {"", "--report", "write the JSON report to FILE"},
    {"", "--junit", "write the JUnit XML report to FILE"},
    {"", "--html", "write the HTML report to FILE"},
    {"", "--text", "write the text report to FILE"},
    {"demo", "--cases", "cases of its randomized check (default 300)"},
    {"demo", "--scenarios", "the scenario files it replays (default the bundled scenarios/fast)"},
    {"trace", "--window", "visible keys per query"},
    {"trace", "--ring", "ring rows per state"},
    {"trace", "--state", "the state id whose rows are shown"},
    {"trace", "--positions", "the query positions, comma-separated"},
    {"trace", "--json", "print JSON instead of the table"},
    {"sweep", "--window",
     "the windows swept: A, A:B or A:B:STEP, or a comma list (default: the built-in grid)"},
    {"sweep", "--drafts", "the drafts per verify swept (default: the built-in grid)"},
    {"sweep", "--chunk", "the prefill chunk sizes swept (default: the built-in grid)"},
    {"sweep", "--order", "the prefill orders: store-then-load, load-then-store or both (default both)"},
    {"sweep", "--states", "states in the pool (default 2)"},
    {"", "--json", "write the table as JSON to FILE (- for stdout)"},
    {"", "--csv", "write the table as CSV to FILE"},
    {"", "--svg", "draw the minimum safe ring per configuration as SVG to FILE"},
    {"sweep", "--formula", "a bound to compare with the minimum found, e.g. W+max(k+1,C)"},
    {"sweep", "--counterexamples", "which counterexamples are written: auto (default), all or none"},
    {"sweep", "--impl", "the cache swept: cpu (default, the ring pool), layer or exec:'COMMAND ARGS'"},
    {"sweep", "--layers-of",
     "a scenario with per-layer windows: the smallest capacity for its sliding layers and for its global "
     "layers, apart (as an iSWA cache sizes two caches), each beside its formula; no grid"},
    {"merge", "--impl",
     "the engine a check's failing case is re-run on: the one the shards ran; needed only for an exec: "
     "engine (a built-in cache is taken from the shards)"},
};

/// The help of `flag` for `command`: its own row, else the common one.
std::string flag_help(const std::string& command, const std::string& flag) {
  for (const FlagHelp& h : kFlagHelp)
    if (command == h.command && flag == h.flag) return h.help;
  for (const FlagHelp& h : kFlagHelp)
    if (std::string_view(h.command).empty() && flag == h.flag) return h.help;
  return "";
}

/// The flags of check (kForCheck) or replay (kForReplay): the option table's rows.
std::vector<FlagSpec> option_table_flags(unsigned command) {
  std::vector<FlagSpec> flags;
  for (const properties::OptionRow& row : properties::kCheckOptions) {
    if (row.commands & command) flags.push_back({std::string(row.flag), std::string(row.value)});
  }
  return flags;
}

/// The table with each flag's help filled in.
std::vector<CommandSpec> with_help(std::vector<CommandSpec> table) {
  for (CommandSpec& c : table)
    for (FlagSpec& f : c.flags) f.help = flag_help(c.name, f.flag);
  return table;
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
        {"--memory-limit", "BYTES"},
        {"--work-limit", "ROWS"}},
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
        {"--impl", "layer|paged|exec:CMD"},
        {"--step-timeout", "S"},
        {"--shard", "I/N"},
        {"--memory-limit", "BYTES"},
        {"--work-limit", "ROWS"},
        {"--layers-of", "SCENARIO"}},
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
      {"completion", "bash", {}, "print a bash completion script: `source <(kvcheck completion bash)`"},
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
  static const std::vector<CommandSpec> table = with_help(make_table());
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
  if (!command.flags.empty()) {
    // "  --flag VALUE   help", the help wrapped in its own column.
    std::size_t column = 0;
    for (const FlagSpec& f : command.flags) column = std::max(column, f.flag.size() + 1 + f.value.size());
    column = std::min<std::size_t>(column, 28) + 4;
    out += "flags:\n";
    for (const FlagSpec& f : command.flags) {
      std::string head = "  " + (f.value.empty() ? f.flag : f.flag + " " + f.value) + "  ";
      if (head.size() > column) {
        out += head.substr(0, head.size() - 2) + "\n";
        head.clear();
      }
      head.resize(column, ' ');
      out += wrap(split_words(f.help), head, std::string(column, ' '));
    }
    out += "\n";
  }
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
    // Its flags, each with what it does, its default and its values.
    if (!c.flags.empty()) out += ".RS\n";
    for (const FlagSpec& f : c.flags) {
      out += ".TP\n.B " + roff(f.flag) + (f.value.empty() ? "" : " \\fI" + roff(f.value) + "\\fR") + "\n" +
             roff(f.help) + "\n";
    }
    if (!c.flags.empty()) out += ".RE\n";
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

std::string bash_completion() {
  // Per command, its flags; per command and flag, what its value completes
  // to: the listed values (A|B|C in lower case), directories, or files.
  std::string commands = "help";
  std::string flag_cases, value_cases;
  for (const CommandSpec& c : command_table()) {
    commands += " " + c.name;
    std::string flags = "--help";
    for (const FlagSpec& f : c.flags) {
      flags += " " + f.flag;
      if (f.value.empty()) continue;
      std::string words;
      const bool listed = f.value.find('|') != std::string::npos &&
                          f.value.find_first_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ:") == std::string::npos;
      if (listed) {
        words = f.value;
        std::replace(words.begin(), words.end(), '|', ' ');
        value_cases += "    " + c.name + ":" + f.flag + ") COMPREPLY=($(compgen -W '" + words + "' -- \"$cur\"));;\n";
      } else if (f.value == "DIR") {
        value_cases += "    " + c.name + ":" + f.flag + ") COMPREPLY=($(compgen -d -- \"$cur\"));;\n";
      } else if (f.value == "FILE" || f.value == "TRACE") {
        value_cases += "    " + c.name + ":" + f.flag + ") COMPREPLY=($(compgen -f -- \"$cur\"));;\n";
      } else {
        value_cases += "    " + c.name + ":" + f.flag + ") COMPREPLY=();;\n";
      }
    }
    if (c.name == "completion") flags += " bash";
    flag_cases += "    " + c.name + ") flags='" + flags + "';;\n";
  }
  return "# bash completion for kvcheck, written by `kvcheck completion bash` from its table of commands.\n"
         "# Load it with: source <(kvcheck completion bash)\n"
         "_kvcheck() {\n"
         "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\" flags=''\n"
         "  if [ \"$COMP_CWORD\" -eq 1 ]; then\n"
         "    COMPREPLY=($(compgen -W '" +
         commands +
         "' -- \"$cur\"))\n"
         "    return 0\n"
         "  fi\n"
         "  case \"${COMP_WORDS[1]}:$prev\" in\n" +
         value_cases +
         "    *)\n"
         "      case \"${COMP_WORDS[1]}\" in\n" +
         flag_cases +
         "      esac\n"
         "      if [[ \"$cur\" == -* || \"${COMP_WORDS[1]}\" == completion ]]; then\n"
         "        COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n"
         "      else\n"
         "        COMPREPLY=($(compgen -f -- \"$cur\"))\n"
         "      fi;;\n"
         "  esac\n"
         "  return 0\n"
         "}\n"
         "complete -F _kvcheck kvcheck\n";
}

int command_completion(int argc, char** argv) {
  const Args args = command_args(argc, argv, "completion");
  if (args.positional().size() != 1 || args.positional().front() != "bash") {
    throw Error(ErrorId::kUsage, args.positional().empty() ? std::string("SHELL") : args.positional().back(),
                "completion takes one shell: bash");
  }
  std::fputs(bash_completion().c_str(), stdout);
  return 0;
}

}  // namespace kvcheck::cli
