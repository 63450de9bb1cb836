// A run's output files written as one set: all of them or none, never a mix
// of two runs, never a stale file from an earlier run left looking current.
//
// write_file_atomic (support/atomic_write.hpp) makes each file whole; a run writes
// several (report.json, report.txt, report.html, junit.xml, a
// counterexample), and a reader must not find some from this run and some
// from the last, or the last run's PASS next to this run's missing FAIL.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kvcheck::reports {

/// One file of a set: where it goes and all of its bytes.
struct OutputFile {
  std::filesystem::path path;
  std::string content;
};

/// An output a flag names, for require_distinct_outputs.
struct NamedOutput {
  std::string flag;  ///< e.g. "--junit"; "--out" for a file a command writes into --out
  std::filesystem::path path;
};

/// Throws Error(kUsage) at the later flag, naming both, when two outputs name
/// one file: the same path once '.', '..' and the symbolic links of its
/// existing directories are resolved, or two names of one existing file.
/// Commands call it before any work (`replay --report F --junit F`, `check
/// --record OUT/report.json`).
void require_distinct_outputs(const std::vector<NamedOutput>& outputs);

/// Throws Error(kIo) at `output.flag` when `output.path` cannot take a file
/// of a set: its directory is missing or not writable, or it is a directory.
/// Touches nothing (an earlier run's file stays until the set replaces it).
void require_writable_output(const NamedOutput& output);

/// Writes `files` as one set, in three phases (two files at one path are
/// refused first, as require_distinct_outputs does, before anything is written):
/// 1. every file is written in full (and fsync'd) to a temporary file beside
///    its target; a failure here (full disk, permissions, a missing
///    directory) publishes nothing: every temporary file is removed, and,
///    under the directory locks of phase 2, so is every file that was at a
///    target path when the call began and is still there (same inode): its
///    content belongs to an earlier run and would otherwise look current. A
///    file another run published meanwhile is left alone. Then Error(kIo)
///    naming the file is thrown;
/// 2. an exclusive lock is taken on each target directory (flock on
///    DIR/.kvcheck-lock, directories in sorted order), so concurrent runs
///    into one directory publish one after the other, never interleaved;
/// 3. the temporary files are renamed over their targets.
/// SIGINT, SIGTERM and SIGHUP are held for the whole call (delivered when it
/// returns), so an interrupt cannot leave half a set or a temporary file.
/// Only SIGKILL or a crash inside phase 3 can; the lock files stay (empty).
void write_output_set(const std::vector<OutputFile>& files);

/// Removes `files` (those that exist) under the same directory locks and
/// signal hold as write_output_set, so a concurrent run's set is never half
/// removed. A run calls it before any work on the set it will write: a run
/// that then ends without a verdict (an adapter that dies, an internal
/// error, a signal, SIGKILL) leaves no earlier run's verdict looking current,
/// and a passing run leaves no earlier run's counterexample. Throws
/// Error(kIo) naming a file that exists and cannot be removed.
void withdraw_output_files(const std::vector<std::filesystem::path>& files);

}  // namespace kvcheck::reports
