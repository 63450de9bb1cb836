// The one progress bar of the CLI (`check`, `demo`, `sweep`): on a terminal
// only, quiet when stderr is not one, so piped output and the tests see no
// control characters.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace kvcheck::cli {

/// A callback that draws `LABEL [#####.....] done/total` on stderr, or an
/// empty function when stderr is not a terminal.
inline std::function<void(std::int64_t, std::int64_t)> progress_bar(const char* label) {
  if (!isatty(fileno(stderr))) return nullptr;
  return [label](std::int64_t done, std::int64_t total) {
    const int width = 30;
    const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld", label,
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total));
    if (done >= total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

}  // namespace kvcheck::cli
