// write_file_atomic: a fresh temporary file in the target's directory + rename(2). rename is
// atomic within one file system, which is why the temporary file lives next
// to the target and not in /tmp.
#include "support/atomic_write.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "support/error.hpp"

namespace kvcheck {
namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what, int err) {
  throw Error(ErrorId::kIo, path.string(), what + ": " + std::strerror(err));
}

}  // namespace

std::string write_temporary_beside(const std::filesystem::path& path, std::string_view content) {
  if (path.empty() || !path.has_filename()) throw Error(ErrorId::kIo, path.string(), "not a file path");
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  // open(O_CREAT | O_EXCL, 0666) rather than mkstemp: mkstemp makes 0600
  // files, and fixing the mode would need the process-wide umask.
  static std::atomic<std::uint64_t> counter{0};
  std::string temp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    temp = (dir / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                   std::to_string(counter.fetch_add(1))))
               .string();
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) fail(path, "cannot create a temporary file in " + dir.string(), errno);

  const char* data = content.data();
  std::size_t left = content.size();
  int err = 0;
  while (left > 0 && err == 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno != EINTR) err = errno;
      continue;
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  // fsync: a crash after the rename must not leave an empty file behind it.
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    fail(path, "cannot write", err);
  }
  return temp;
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  const std::string temp = write_temporary_beside(path, content);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    fail(path, "cannot replace", err);
  }
  // Persist the rename itself; a failure here leaves a complete file either way.
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace kvcheck
