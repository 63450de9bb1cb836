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

/// Writes `files` as one set, in three phases:
/// 1. every file is written in full (and fsync'd) to a temporary file beside
///    its target; a failure here (full disk, permissions, a missing
///    directory) publishes nothing: every temporary file is removed, and so
///    is every file already at a target path, whose content belongs to an
///    earlier run and would otherwise look current; then Error(kIo) naming
///    the file is thrown;
/// 2. an exclusive lock is taken on each target directory (flock on
///    DIR/.kvcheck-lock, directories in sorted order), so concurrent runs
///    into one directory publish one after the other, never interleaved;
/// 3. the temporary files are renamed over their targets.
/// SIGINT, SIGTERM and SIGHUP are held for the whole call (delivered when it
/// returns), so an interrupt cannot leave half a set or a temporary file.
/// Only SIGKILL or a crash inside phase 3 can; the lock files stay (empty).
void write_output_set(const std::vector<OutputFile>& files);

}  // namespace kvcheck::reports
