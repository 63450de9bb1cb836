// Trace files: JSON Lines, format version 1 (scenarios/trace.hpp for the
// records, scenarios/schema/trace.schema.json for the schema).
//
// Reading is strict: every line is one JSON object (blank lines are
// skipped), duplicate keys, unknown keys, wrong types, non-finite numbers and
// out-of-range values are kvcheck::Error naming the line and the JSON path
// inside it (`line 3: written[2]`, `line 1: window.convention`), with the
// file appended to the message. Beyond each line, a run's records must be in
// order: step indices 0, 1, 2, ... (one record per layer and step, layers
// ascending, a begin before its step), every layer of a step agrees on the
// step (kind, request, state, position, sizes), sizes agree with `rows`,
// block tables cover every position they are asked to read, and nothing
// follows a refusal. Whether the schedule itself is valid (docs/semantics.md "Steps") is
// judged by `kvcheck audit` (properties/audit.hpp), also naming the line.
//
// Writing: one record per line, fixed key order, integers as integers and
// doubles in the shortest text that reads back to the same value, so a
// trace read back holds exactly the numbers written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "scenarios/trace.hpp"

namespace kvcheck::scenarios {

/// Most slots one step may read once its block table is expanded (all
/// queries together); keeps a small file from asking for terabytes.
inline constexpr std::int64_t kMaxExpandedReads = std::int64_t{1} << 26;

/// Stable names used by the format.
std::string_view trace_kind_name(TraceKind k) noexcept;
std::string_view addressing_name(Addressing a) noexcept;
std::string_view read_view_name(TraceReadView v) noexcept;

/// Parses a whole trace (one or more runs). `source` (a file name, or empty)
/// is appended to error messages. Throws kvcheck::Error: kJsonSyntax,
/// kJsonType, kJsonUnknownKey, kJsonMissingKey, kJsonValue, kSize,
/// kNonFinite; where() is "line N: PATH" (or "line N").
std::vector<TraceRun> parse_trace(std::string_view text, const std::string& source = "");

/// Reads and parses one file; kIo when it cannot be read.
std::vector<TraceRun> load_trace_file(const std::filesystem::path& path);

/// Expands files and directories into a sorted, duplicate-free list: a
/// directory contributes every regular `*.jsonl` file below it; a file
/// argument is taken as given. Throws kIo for a path that does not exist.
std::vector<std::filesystem::path> collect_trace_files(const std::vector<std::string>& files_or_dirs);

/// The slots each query of a writing step read: `read` as given, or the
/// block table expanded with `window_keys` (see BlockTable). Empty lists
/// for a record without reads. Throws kvcheck::Error naming the record's
/// line for a block table that does not cover a position it reads.
std::vector<std::vector<std::int64_t>> trace_read_slots(const TraceStep& step, std::int64_t window_keys);

/// One header line / one step record line, each ending in '\n'.
std::string trace_header_line(const TraceHeader& header);
std::string trace_step_line(const TraceStep& step);

/// Appends trace lines to memory or to a file. Thread-safe: each append()
/// lands as one piece, so runs recorded by different threads stay whole.
class TraceWriter {
 public:
  /// Keeps the trace in memory (text()).
  TraceWriter() = default;
  /// Creates or truncates `path` and appends to it (text() stays empty);
  /// throws kvcheck::Error(kIo) when the file cannot be opened, and on any
  /// later write failure.
  explicit TraceWriter(const std::filesystem::path& path);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  void header(const TraceHeader& header) { append(trace_header_line(header)); }
  void step(const TraceStep& step) { append(trace_step_line(step)); }
  /// Appends whole lines (flushed to the file before returning).
  void append(std::string_view lines);
  /// Everything appended so far (in-memory writers only).
  std::string text() const;
  /// Throws kvcheck::Error(kIo) when an earlier append failed (appends made
  /// from a destructor, as the recording provider's, cannot throw); call it
  /// once the recorded runs are done.
  void check() const;

 private:
  mutable std::mutex mutex_;
  std::string text_;
  std::string failure_;  ///< the first write failure, empty when none
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace kvcheck::scenarios
