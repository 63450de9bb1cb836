// write_output_set: write all to temporaries, lock the directories, rename
// all; on failure remove the temporaries and the stale targets.
#include "reports/output_set.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
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

/// What is at a path: nothing, or a file with its device and inode. Taken
/// when a call begins, it tells an earlier run's file (same identity at the
/// end) from one another run published meanwhile (a rename: a new inode).
struct Identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const Identity& o) const { return exists == o.exists && dev == o.dev && ino == o.ino; }
};

Identity identity_of(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return {};
  return {true, st.st_dev, st.st_ino};
}

/// `path` with '.', '..' and the symbolic links of its existing part resolved.
std::string resolved(const fs::path& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return path.lexically_normal().string();
  const fs::path canonical = fs::weakly_canonical(absolute, ec);
  return (ec ? absolute.lexically_normal() : canonical).string();
}

/// An exclusive lock on each target directory, taken in sorted order (no
/// deadlock between runs).
std::vector<std::unique_ptr<DirectoryLock>> lock_directories(const std::vector<OutputFile>& files) {
  std::set<std::string> dirs;
  for (const auto& f : files) dirs.insert(resolved(directory_of(f.path)));
  std::vector<std::unique_ptr<DirectoryLock>> locks;
  for (const auto& d : dirs) locks.push_back(std::make_unique<DirectoryLock>(d));
  return locks;
}

/// Withdraws a set that could not be published, with every target directory
/// locked: the first `published` targets hold this call's files and go; every
/// other target goes only when it still holds what it held when the call
/// began (an earlier run's file, which would look current). A file another
/// run published in the meantime stays: it is that run's, and whole.
void withdraw(const std::vector<OutputFile>& files, const std::vector<Identity>& seen,
              std::size_t published) {
  for (std::size_t k = 0; k < files.size(); ++k) {
    if (k < published || (seen[k].exists && identity_of(files[k].path) == seen[k])) {
      ::unlink(files[k].path.c_str());
    }
  }
}

}  // namespace

void require_distinct_outputs(const std::vector<NamedOutput>& outputs) {
  std::map<std::string, const NamedOutput*> by_path;
  for (const auto& o : outputs) {
    const auto [it, fresh] = by_path.emplace(resolved(o.path), &o);
    // Two names of one existing file (a hard link) are one file too.
    const NamedOutput* same = fresh ? nullptr : it->second;
    for (const auto& [path, other] : by_path) {
      if (same != nullptr || other == &o) continue;
      const Identity a = identity_of(o.path);
      if (a.exists && a == identity_of(other->path)) same = other;
    }
    if (same != nullptr) {
      throw Error(ErrorId::kUsage, o.flag,
                  "names the file '" + o.path.string() + "', which " + same->flag +
                      " also writes; give each output its own file");
    }
  }
}

void require_writable_output(const NamedOutput& output) {
  const fs::path dir = directory_of(output.path);
  std::error_code ec;
  if (!output.path.has_filename() || fs::is_directory(output.path, ec)) {
    throw Error(ErrorId::kIo, output.flag, "'" + output.path.string() + "' is a directory, not a file");
  }
  if (!fs::is_directory(dir, ec)) {
    throw Error(ErrorId::kIo, output.flag,
                "directory '" + dir.string() + "' of '" + output.path.string() + "' does not exist");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error(ErrorId::kIo, output.flag, "directory '" + dir.string() + "' is not writable");
  }
}

void write_output_set(const std::vector<OutputFile>& files) {
  if (files.empty()) return;
  {
    // Two members of a set at one path would leave whichever was renamed last.
    std::vector<NamedOutput> named;
    for (const auto& f : files) named.push_back({f.path.string(), f.path});
    require_distinct_outputs(named);
  }
  const SignalHold hold;
  std::vector<Identity> seen;
  seen.reserve(files.size());
  for (const auto& f : files) seen.push_back(identity_of(f.path));

  // 1. Everything to temporaries; on failure publish nothing and, under the
  //    directory locks, withdraw the earlier run's files (see withdraw).
  std::vector<std::string> temps;
  temps.reserve(files.size());
  try {
    for (const auto& f : files) temps.push_back(write_temporary_beside(f.path, f.content));
  } catch (...) {
    for (const auto& t : temps) ::unlink(t.c_str());
    const auto locks = lock_directories(files);
    withdraw(files, seen, 0);
    throw;
  }

  // 2. Lock every target directory, in a fixed order (no deadlock between runs).
  const auto locks = lock_directories(files);

  // 3. Publish. A rename fails only for reasons that hold for the whole
  //    directory (it vanished, permissions changed); then the set is
  //    withdrawn as in phase 1.
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (::rename(temps[i].c_str(), files[i].path.c_str()) != 0) {
      const int err = errno;
      for (std::size_t k = i; k < files.size(); ++k) ::unlink(temps[k].c_str());
      withdraw(files, seen, i);
      throw Error(ErrorId::kIo, files[i].path.string(), std::string("cannot replace: ") + std::strerror(err));
    }
  }
}

void withdraw_output_files(const std::vector<std::filesystem::path>& files) {
  // Nothing there: nothing to withdraw, and no lock file left in a directory
  // no run has written to.
  std::error_code ec;
  const bool any = std::any_of(files.begin(), files.end(), [&ec](const std::filesystem::path& f) {
    return std::filesystem::symlink_status(f, ec).type() != std::filesystem::file_type::not_found;
  });
  if (!any) return;
  const SignalHold hold;
  std::set<std::string> dirs;
  for (const auto& f : files) dirs.insert(resolved(directory_of(f)));
  std::vector<std::unique_ptr<DirectoryLock>> locks;
  for (const auto& d : dirs) locks.push_back(std::make_unique<DirectoryLock>(d));
  for (const auto& f : files) {
    if (::unlink(f.c_str()) != 0 && errno != ENOENT) {
      const int err = errno;
      throw Error(ErrorId::kIo, f.string(),
                  std::string("cannot remove an earlier run's file: ") + std::strerror(err));
    }
  }
}

}  // namespace kvcheck::reports
