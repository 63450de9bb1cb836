// The commands of the kvcheck executable, listed once: each command's name,
// positional arguments, flags (with the value each shows in the usage) and a
// one-line summary. From this table every command's parser gets the flags it
// accepts (command_args), and `kvcheck help`, `kvcheck COMMAND --help` and
// the man page (`kvcheck help --man`, built into kvcheck.1) are written, so a
// flag the parser accepts is in the usage and a flag in the usage is
// accepted. check and replay take their rows from the option table
// (properties/option_table.hpp, KVCHECK_CHECK_OPTIONS).
//
// A new flag of a command is one entry here (and, for check or replay, one
// row of KVCHECK_CHECK_OPTIONS); docs/usage.md's usage block is what
// `kvcheck help` prints (tests/cli/cli_test.cpp compares them).
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cli/args.hpp"

namespace kvcheck::cli {

/// One flag of a command.
struct FlagSpec {
  std::string flag;       ///< "--window"
  std::string value;      ///< what the usage shows as its value ("W"); empty: a boolean flag
  bool required = false;  ///< shown without brackets: the command refuses to run without it
  /// What it does, its default and its values: `kvcheck COMMAND --help` and
  /// the man page print it (from the help table of cli/usage.cpp).
  std::string help = "";
};

/// One command of the executable.
struct CommandSpec {
  std::string name;        ///< "check"
  std::string positional;  ///< "FILE|DIR..."; empty: the command takes none
  std::vector<FlagSpec> flags;
  std::string summary;  ///< one line: what the command does

  std::set<std::string> value_flags() const;  ///< the flags that take a value
  std::set<std::string> bool_flags() const;   ///< the flags that take none
};

/// Every command, in the order the usage lists them.
const std::vector<CommandSpec>& command_table();

/// The command named `name`; nullptr when there is none.
const CommandSpec* find_command(std::string_view name);

/// argv[2..argc) read with the flags of command `name` (which must be in
/// the table).
Args command_args(int argc, char** argv, std::string_view name);

/// The usage lines of one command ("  kvcheck NAME ..."), wrapped to the
/// usage's width with continuation lines indented under the arguments.
std::string command_synopsis(const CommandSpec& command);

/// `kvcheck help`: every command's summary, every command's usage lines and
/// the notes (IMPL, --shard, exit codes).
std::string usage_text();

/// `kvcheck COMMAND --help`: "usage:", the command's usage lines, its
/// summary and the notes (IMPL, exit codes).
std::string command_usage_text(const CommandSpec& command);

/// `kvcheck help --man`: the man page (man(7) macros), the same table and
/// notes as the usage.
std::string man_page(std::string_view version);

/// `kvcheck completion bash`: a bash completion script for the commands,
/// their flags and the flags' listed values, from the same table.
std::string bash_completion();

/// `kvcheck completion SHELL` (bash only): prints the script; exit 0.
int command_completion(int argc, char** argv);

}  // namespace kvcheck::cli
