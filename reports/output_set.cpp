// write_output_set: write all to temporaries, lock the directories, rename
// all; on failure remove the temporaries and the stale targets.
#include "reports/output_set.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "support/atomic_write.hpp"
#include "support/error.hpp"

namespace kvcheck::reports {
namespace {

namespace fs = std::filesystem;

fs::path directory_of(const fs::path& path) {
  return path.has_parent_path() ? path.parent_path() : fs::path(".");
}

/// Holds SIGINT, SIGTERM and SIGHUP for its lifetime (this thread's mask;
/// the CLI writes its outputs from the main thread after the workers joined).
class SignalHold {
 public:
  SignalHold() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    held_ = pthread_sigmask(SIG_BLOCK, &set, &old_) == 0;
  }
  ~SignalHold() {
    if (held_) pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalHold(const SignalHold&) = delete;
  SignalHold& operator=(const SignalHold&) = delete;

 private:
  sigset_t old_{};
  bool held_ = false;
};

/// Exclusive flock on DIR/.kvcheck-lock for its lifetime.
class DirectoryLock {
 public:
  explicit DirectoryLock(const fs::path& dir) {
    const std::string file = (dir / ".kvcheck-lock").string();
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) return;  // no lock possible (read-only directory): the renames will say why
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

void write_output_set(const std::vector<OutputFile>& files) {
  if (files.empty()) return;
  const SignalHold hold;

  // 1. Everything to temporaries; on failure publish nothing and leave no
  //    earlier run's file at a target path.
  std::vector<std::string> temps;
  temps.reserve(files.size());
  try {
    for (const auto& f : files) temps.push_back(write_temporary_beside(f.path, f.content));
  } catch (...) {
    for (const auto& t : temps) ::unlink(t.c_str());
    for (const auto& f : files) ::unlink(f.path.c_str());
    throw;
  }

  // 2. Lock every target directory, in a fixed order (no deadlock between runs).
  std::set<std::string> dirs;
  for (const auto& f : files) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(directory_of(f.path), ec);
    dirs.insert((ec ? directory_of(f.path) : canonical).string());
  }
  std::vector<std::unique_ptr<DirectoryLock>> locks;
  for (const auto& d : dirs) locks.push_back(std::make_unique<DirectoryLock>(d));

  // 3. Publish. A rename fails only for reasons that hold for the whole
  //    directory (it vanished, permissions changed); then the set is
  //    withdrawn as in phase 1.
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (::rename(temps[i].c_str(), files[i].path.c_str()) != 0) {
      const int err = errno;
      for (std::size_t k = i; k < files.size(); ++k) ::unlink(temps[k].c_str());
      for (const auto& f : files) ::unlink(f.path.c_str());
      throw Error(ErrorId::kIo, files[i].path.string(), std::string("cannot replace: ") + std::strerror(err));
    }
  }
}

}  // namespace kvcheck::reports
