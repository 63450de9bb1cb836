// One function per kvcheck subcommand; each returns the process exit code.
#pragma once

namespace kvcheck::cli {

int command_demo(int argc, char** argv);
int command_spec(int argc, char** argv);
int command_check(int argc, char** argv);
int command_replay(int argc, char** argv);
int command_trace(int argc, char** argv);
int command_sweep(int argc, char** argv);
int command_faults(int argc, char** argv);
int command_audit(int argc, char** argv);

}  // namespace kvcheck::cli
