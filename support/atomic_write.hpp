// The one atomic file writer: reports, shard documents, sweep outputs and
// scenario (counterexample) files all go through it. Readers see either the
// old file or the complete new one, never a half-written file; the content
// is fsync'ed before the rename and the directory after it.
#pragma once

#include <filesystem>
#include <string_view>

namespace kvcheck {

/// Writes `content` to a temporary file in the same directory as `path`, then
/// renames it over `path` (and fsyncs the directory, so the rename itself
/// survives a crash). On failure throws kvcheck::Error(ErrorId::kIo,
/// path, reason), leaves any existing file at `path` untouched and removes
/// the temporary file.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

/// Writes all of `content` (then fsync) to a new temporary file beside
/// `target` (".NAME.tmp-PID-N" in the same directory, so a rename onto the
/// target is atomic) and returns its path; on failure removes it and throws
/// kvcheck::Error(ErrorId::kIo, target, reason). The step write_file_atomic
/// and reports::write_output_set (reports/output_set.hpp) share.
std::string write_temporary_beside(const std::filesystem::path& target, std::string_view content);

}  // namespace kvcheck
