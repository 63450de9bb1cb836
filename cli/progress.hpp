// The one progress line of the CLI (`check`, `demo`, `sweep`): on a terminal
// only, quiet when stderr is not one, so piped output and the tests see no
// control characters. It is redrawn every tenth of a second while work runs
// (the check's coordinating thread calls it), with the rate, an estimate of
// the time left and the time so far, so it keeps moving while the last long
// cases finish; after the cases, the activity line says what the check is
// doing (running the failing case again, shrinking it).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace kvcheck::cli {

/// "LABEL [#####.....] done/total, R/s, about E s left (T s)": the progress
/// line's text after `seconds` of work (rate and estimate once a case is done).
inline std::string progress_text(const std::string& label, std::int64_t done, std::int64_t total,
                                 double seconds) {
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  char tail[160];
  if (done > 0 && seconds > 0) {
    const double rate = static_cast<double>(done) / seconds;
    const double left = static_cast<double>(total - done) / rate;
    std::snprintf(tail, sizeof tail, ", %.1f/s, about %.0f s left (%.0f s)", rate, left, seconds);
  } else {
    std::snprintf(tail, sizeof tail, " (%.0f s)", seconds);
  }
  return label + " [" + std::string(static_cast<std::size_t>(filled), '#') +
         std::string(static_cast<std::size_t>(width - filled), '.') + "] " + std::to_string(done) + "/" +
         std::to_string(total) + tail;
}

/// A callback that draws the progress line on stderr, or an empty function
/// when stderr is not a terminal.
inline std::function<void(std::int64_t, std::int64_t)> progress_bar(const char* label) {
  if (!isatty(fileno(stderr))) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  return [label, start](std::int64_t done, std::int64_t total) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // "\033[K" clears what a longer earlier line left on the right.
    std::fprintf(stderr, "\r%s\033[K", progress_text(label, done, total, seconds).c_str());
    if (done >= total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

/// A callback that shows what a command does after its cases ("LABEL:
/// shrinking case seed 42: 17 runs, 5 steps (3 s)") on one line of stderr,
/// or an empty function when stderr is not a terminal. An empty `what`
/// (the work is done) clears the line, so the summary starts on a clean one.
inline std::function<void(const std::string&)> activity_line(const char* label) {
  if (!isatty(fileno(stderr))) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  return [label, start](const std::string& what) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (what.empty()) {
      std::fputs("\r\033[K", stderr);
    } else {
      std::fprintf(stderr, "\r%s: %s (%.0f s)\033[K", label, what.c_str(), seconds);
    }
    std::fflush(stderr);
  };
}

}  // namespace kvcheck::cli
