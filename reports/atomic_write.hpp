// Atomic file replacement for report and counterexample files: readers see
// either the old file or the complete new one, never a half-written file.
#pragma once

#include <filesystem>
#include <string_view>

namespace kvcheck::reports {

/// Writes `content` to a temporary file in the same directory as `path`, then
/// renames it over `path`. On failure throws kvcheck::Error(ErrorId::kIo,
/// path, reason), leaves any existing file at `path` untouched and removes
/// the temporary file.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

}  // namespace kvcheck::reports
