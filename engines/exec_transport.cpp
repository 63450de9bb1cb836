#include "engines/exec_transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "support/error.hpp"

extern char** environ;

namespace kvcheck::engines {

namespace {

using Clock = std::chrono::steady_clock;

// ---- every adapter kvcheck runs, for the signal handlers ---------------------
//
// A fixed table of atomics (no allocation, no lock) so that a signal handler
// can read it. An entry is the pid of an adapter's /bin/sh, which is also its
// process group id, from spawn until it has been reaped.

constexpr int kMaxAdapters = 1024;
std::array<std::atomic<pid_t>, kMaxAdapters> g_adapters{};
// Held around spawn + register and around the orphan sweep, so a sweep never
// takes an adapter that is being started for an orphan.
std::mutex g_spawn_mutex;
bool g_process_setup_done = false;  // under g_spawn_mutex
// The process that started the adapters: a fork of it (an API host's child
// that never execs) inherits the table and the atexit hook, not the adapters.
std::atomic<pid_t> g_owner{0};
// Set by the terminating-signal handler before it kills anything: no thread
// starts an adapter after it (one that started meanwhile kills its own), so
// the handler's sweep ends instead of chasing what other worker threads keep
// starting (each closed adapter of a run can leave an orphan to sweep).
std::atomic<bool> g_terminating{false};
// Threads between posix_spawn and register_adapter, with the terminating
// signals blocked in them: the handler (on another thread) waits for them
// to register what they started before it kills, else an adapter started in
// that window outlives kvcheck.
std::atomic<int> g_spawning{0};

// The environment variable every adapter (and what it starts) inherits: a
// process that became kvcheck's child and carries it is an adapter's orphan.
constexpr char kSessionVariable[] = "KVCHECK_EXEC_SESSION=";

bool register_adapter(pid_t pid) noexcept {
  for (auto& slot : g_adapters) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return true;
  }
  return false;
}

void unregister_adapter(pid_t pid) noexcept {
  for (auto& slot : g_adapters) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

bool is_adapter(pid_t pid) noexcept {
  for (const auto& slot : g_adapters)
    if (slot.load() == pid) return true;
  return false;
}

bool any_adapter() noexcept {
  for (const auto& slot : g_adapters)
    if (slot.load() != 0) return true;
  return false;
}

// ---- async-signal-safe helpers: no allocation, no stdio ----------------------

/// Writes the decimal digits of `value` at `out`; returns the end.
char* put_decimal(char* out, long value) noexcept {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  while (n > 0) *out++ = digits[--n];
  return out;
}

/// "/proc/PID/NAME" into `path` (at least 64 bytes).
void proc_path(char* path, long pid, const char* name) noexcept {
  char* p = path;
  for (const char* s = "/proc/"; *s;) *p++ = *s++;
  p = put_decimal(p, pid);
  *p++ = '/';
  while (*name) *p++ = *name++;
  *p = '\0';
}

/// The parent pid in /proc/PID/stat ("pid (comm) state ppid ..."; comm may
/// hold spaces and parentheses, so the last ')' ends it); -1 when unreadable.
long parent_of(long pid) noexcept {
  char path[64];
  proc_path(path, pid, "stat");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return -1;
  int close_paren = -1;
  for (int i = 0; i < n; ++i)
    if (buf[i] == ')') close_paren = i;
  // ") S PPID": skip ") ", the state letter and a space.
  int i = close_paren + 4;
  if (close_paren < 0 || i >= n) return -1;
  long ppid = 0;
  for (; i < n && buf[i] >= '0' && buf[i] <= '9'; ++i) ppid = ppid * 10 + (buf[i] - '0');
  return ppid;
}

/// Whether /proc/PID/environ holds KVCHECK_EXEC_SESSION=<our pid>.
bool carries_session(long pid, const char* entry, int entry_bytes) noexcept {
  char path[64];
  proc_path(path, pid, "environ");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  int matched = 0;  // characters of `entry` matched at the start of this variable; -1: not it
  bool found = false;
  for (ssize_t n; !found && (n = ::read(fd, buf, sizeof buf)) > 0;) {
    for (ssize_t i = 0; i < n && !found; ++i) {
      const char c = buf[i];
      if (c == '\0') {
        found = matched == entry_bytes;
        matched = 0;
      } else if (matched >= 0 && matched < entry_bytes && c == entry[matched]) {
        ++matched;
      } else {
        matched = -1;
      }
    }
  }
  ::close(fd);
  return found;
}

struct LinuxDirent64 {
  std::uint64_t d_ino;
  std::int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[1];
};

/// Kills and reaps, until none is left, every child of kvcheck that is not a
/// registered adapter and carries this session's variable: what an adapter
/// left when its parent died (kvcheck is their subreaper). Each round the
/// processes killed hand their own children to kvcheck, so the loop ends
/// when the last descendant is gone.
void sweep_orphans() noexcept {
  const long self = ::getpid();
  char entry[64];
  char* e = entry;
  for (const char* s = kSessionVariable; *s;) *e++ = *s++;
  e = put_decimal(e, self);
  const int entry_bytes = static_cast<int>(e - entry);
  for (int round = 0; round < 100000; ++round) {
    pid_t found[256];
    int count = 0;
    const int dir = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return;
    alignas(8) char buf[8192];
    for (long n; count < 256 && (n = ::syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0;) {
      for (long off = 0; off < n && count < 256;) {
        const auto* d = reinterpret_cast<const LinuxDirent64*>(buf + off);
        off += d->d_reclen;
        long pid = 0;
        const char* c = d->d_name;
        for (; *c >= '0' && *c <= '9'; ++c) pid = pid * 10 + (*c - '0');
        if (*c != '\0' || pid <= 0) continue;
        if (parent_of(pid) != self || is_adapter(static_cast<pid_t>(pid))) continue;
        if (!carries_session(pid, entry, entry_bytes)) continue;
        found[count++] = static_cast<pid_t>(pid);
      }
    }
    ::close(dir);
    if (count == 0) return;
    for (int i = 0; i < count; ++i) {
      ::kill(-found[i], SIGKILL);  // its group, when it leads one (a setsid grandchild does)
      ::kill(found[i], SIGKILL);
    }
    for (int i = 0; i < count; ++i) {
      int status = 0;
      while (::waitpid(found[i], &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

/// SIGINT, SIGTERM, SIGHUP: every adapter goes, then kvcheck ends with the
/// signal's default action (so its parent sees the conventional status).
extern "C" void on_terminating_signal(int sig) {
  g_terminating.store(true);
  // A spawn in flight on another thread registers its adapter first (at most
  // about 10 s: nanosleep is async-signal-safe; that thread blocks these
  // signals, so this handler never waits for itself).
  for (int i = 0; i < 100000 && g_spawning.load() > 0; ++i) {
    struct timespec pause_for {0, 100000};
    ::nanosleep(&pause_for, nullptr);
  }
  kill_exec_children();
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // blocked in this handler; delivered (and fatal) when it returns
}

extern "C" void at_exit_kill_children() {
  kill_exec_children();
}

/// Once per process, before the first adapter: subreaper, handlers, atexit.
void setup_process() {
  if (g_process_setup_done) return;
  g_process_setup_done = true;
  g_owner = ::getpid();
  // A write to a dead adapter must come back as EPIPE, not kill kvcheck.
  ::signal(SIGPIPE, SIG_IGN);
#ifdef __linux__
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
#endif
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    // A handler the host program installed (or SIG_IGN, as nohup sets) stays.
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
    struct sigaction act {};
    act.sa_handler = on_terminating_signal;
    sigemptyset(&act.sa_mask);
    ::sigaction(sig, &act, nullptr);
  }
  std::atexit(at_exit_kill_children);
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

int poll_ms(Clock::time_point deadline) {
  const double left = std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left >= INT_MAX ? INT_MAX : static_cast<int>(std::ceil(left));
}

constexpr std::size_t kChunkBytes = 65536;
// Pipe buffers are raised to this (Linux F_SETPIPE_SZ; its default
// /proc/sys/fs/pipe-max-size) so a long line crosses in fewer wake-ups.
constexpr int kPipeBytes = 1 << 20;
constexpr std::size_t kMaxChunkBytes = kPipeBytes;

/// The adapter as a child process and its three non-blocking pipes.
class ChildTransport final : public ExecTransport {
 public:
  ChildTransport(const std::string& command, double timeout_seconds)
      : timeout_seconds_(timeout_seconds),
        // Far enough never to matter, near enough not to overflow the clock.
        timeout_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(std::min(timeout_seconds, 1e8)))) {
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0) pipe_error();
    if (::pipe2(out, O_CLOEXEC) != 0) {
      close_pair(in);
      pipe_error();
    }
    if (::pipe2(err, O_CLOEXEC) != 0) {
      close_pair(in);
      close_pair(out);
      pipe_error();
    }
    // The adapter's environment: kvcheck's, with this session's marker.
    const std::string session = kSessionVariable + std::to_string(::getpid());
    std::vector<char*> env;
    for (char** e = environ; e && *e; ++e)
      if (std::strncmp(*e, kSessionVariable, sizeof kSessionVariable - 1) != 0) env.push_back(*e);
    env.push_back(const_cast<char*>(session.c_str()));
    env.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group, so the whole tree (sh and the adapter) can be
    // killed; default SIGPIPE and an empty signal mask, whatever kvcheck's.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t defaults, mask;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    sigemptyset(&mask);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setsigmask(&attr, &mask);
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    int rc = 0;
    bool registered = true;
    {
      const std::lock_guard<std::mutex> lock(g_spawn_mutex);
      setup_process();
      // kvcheck is ending by a signal: its handler is killing every adapter
      // and then the process; this thread starts none and waits for the end.
      while (g_terminating.load()) ::pause();
      // Spawn and register with the terminating signals blocked here and
      // counted in g_spawning, so the handler kills what this starts.
      sigset_t terminating, previous;
      sigemptyset(&terminating);
      for (const int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&terminating, sig);
      ::pthread_sigmask(SIG_BLOCK, &terminating, &previous);
      g_spawning.fetch_add(1);
      if (g_terminating.load()) {
        rc = EINTR;  // the handler began before this counted: start nothing
      } else {
        rc = ::posix_spawn(&pid_, "/bin/sh", &actions, &attr, const_cast<char* const*>(argv), env.data());
        if (rc == 0) registered = register_adapter(pid_);
      }
      g_spawning.fetch_sub(1);
      ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      while (g_terminating.load()) ::pause();
    }
    // Started while the handler began its kill pass: gone with the others.
    if (rc == 0 && g_terminating.load()) ::kill(-pid_, SIGKILL);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    err_child_ = err[0];
    if (rc != 0) {
      pid_ = -1;
      close_all();
      throw Error(ErrorId::kAdapter, "--impl", "cannot start '" + command + "': " + std::strerror(rc));
    }
    for (const int fd : {to_child_, from_child_, err_child_}) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
#ifdef F_SETPIPE_SZ
      ::fcntl(fd, F_SETPIPE_SZ, kPipeBytes);  // best effort: the default (64 KB) works too
#endif
    }
    if (!registered) {
      stop();
      throw Error(ErrorId::kAdapter, "--impl",
                  "more than " + std::to_string(kMaxAdapters) + " exec adapters at once");
    }
  }

  ~ChildTransport() override {
    stop();
  }
  ChildTransport(const ChildTransport&) = delete;
  ChildTransport& operator=(const ChildTransport&) = delete;

  void send(std::string_view line, const std::string& where) override {
    if (pid_ <= 0) fail(where, "the adapter has already been stopped");
    // Anything on stdout now came after the last answer, unasked.
    read_stdout_now(where);
    if (!buffer_.empty()) unrequested_line(where);
    const auto deadline = Clock::now() + timeout_;
    std::size_t done = 0;
    while (done < line.size()) {
      pollfd fds[3] = {{to_child_, POLLOUT, 0}, {from_child_, POLLIN, 0}, {err_child_, POLLIN, 0}};
      const int rc = ::poll(fds, 3, poll_ms(deadline));
      if (rc < 0 && errno != EINTR) fail(where, std::string("poll failed: ") + std::strerror(errno));
      if (rc < 0) continue;
      if (fds[2].revents) read_stderr();
      if (fds[1].revents) {
        if (!read_stdout()) crashed(where, "the adapter closed its stdout" + exit_text());
        if (!buffer_.empty()) unrequested_line(where);
      }
      if (fds[0].revents) {
        const ssize_t n = ::write(to_child_, line.data() + done, line.size() - done);
        if (n < 0 && errno == EPIPE) {
          crashed(where, "the adapter stopped taking requests (" + std::string(std::strerror(errno)) + ")" +
                             exit_text());
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
          fail(where,
               "cannot write to the adapter (" + std::string(std::strerror(errno)) + ")" + exit_text());
        }
        if (n > 0) done += static_cast<std::size_t>(n);
      }
      if (done < line.size() && Clock::now() >= deadline) {
        fail(where, "the adapter read " + std::to_string(done) + " of the request's " +
                        std::to_string(line.size()) + " bytes within " + format_seconds(timeout_seconds_) +
                        " s (--step-timeout): it stopped reading its stdin");
      }
    }
  }

  std::string receive(const std::string& where) override {
    std::string line = receive_header(where);
    if (!buffer_.empty()) unrequested_line(where);
    return line;
  }

  std::string receive_header(const std::string& where) override {
    if (pid_ <= 0) fail(where, "the adapter has already been stopped");
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      // Only the bytes not yet looked at are searched: linear in the line.
      if (scanned_ < buffer_.size()) {
        const void* nl = std::memchr(buffer_.data() + scanned_, '\n', buffer_.size() - scanned_);
        if (nl != nullptr) {
          const std::size_t at = static_cast<std::size_t>(static_cast<const char*>(nl) - buffer_.data());
          std::string rest = buffer_.substr(at + 1);
          buffer_.resize(at);
          std::string line;
          line.swap(buffer_);  // the line itself is never copied
          buffer_ = std::move(rest);
          scanned_ = 0;
          answered_ = where;
          return line;
        }
        scanned_ = buffer_.size();
      }
      if (buffer_.size() > kExecMaxLineBytes) fail(where, "an answer line longer than 1 GiB");
      if (Clock::now() >= deadline) {
        // The process is alive (else stdout would have closed): the usual
        // cause is an answer written into a buffer and never flushed.
        fail(where, "no answer within " + format_seconds(timeout_seconds_) +
                        " s (--step-timeout); the adapter is still running: if it wrote its answer, flush "
                        "stdout after each line (Python: print(..., flush=True) or sys.stdout.flush())");
      }
      if (!await_output(where, deadline)) crashed(where, "the adapter closed its stdout" + exit_text());
    }
  }

  std::string receive_bytes(std::size_t bytes, const std::string& where) override {
    if (pid_ <= 0) fail(where, "the adapter has already been stopped");
    if (bytes > kExecMaxFrameBytes) fail(where, "a binary frame longer than 1 GiB");
    const auto deadline = Clock::now() + timeout_;
    // The buffer grows with what arrives (read_stdout's doubling), so a frame
    // that never comes costs nothing; a whole one costs itself plus a chunk.
    while (buffer_.size() < bytes) {
      if (Clock::now() >= deadline) {
        fail(where, "the adapter sent " + std::to_string(buffer_.size()) + " of the frame's " +
                        std::to_string(bytes) + " bytes within " + format_seconds(timeout_seconds_) +
                        " s (--step-timeout)");
      }
      if (!await_output(where, deadline)) {
        crashed(where, "the adapter closed its stdout after " + std::to_string(buffer_.size()) +
                           " of the frame's " + std::to_string(bytes) + " bytes" + exit_text());
      }
    }
    std::string payload;
    if (buffer_.size() == bytes) {
      payload.swap(buffer_);  // the usual case: the frame is never copied
    } else {
      payload.assign(buffer_, 0, bytes);
      buffer_.erase(0, bytes);
    }
    scanned_ = 0;
    if (!buffer_.empty()) unrequested_line(where);
    return payload;
  }

 protected:
  std::string on_failure(const std::string& what) override {
    read_stderr();
    std::string message = what;
    std::string tail = stderr_tail();
    while (!tail.empty() && tail.back() == '\n') tail.pop_back();
    if (!tail.empty()) message += "\n--- last lines of the adapter's stderr ---\n" + tail;
    stop();
    return message;
  }

 private:
  [[noreturn]] static void pipe_error() {
    throw Error(ErrorId::kAdapter, "--impl", std::string("cannot create pipes: ") + std::strerror(errno));
  }
  static void close_pair(int* fds) noexcept {
    ::close(fds[0]);
    ::close(fds[1]);
  }

  [[noreturn]] void unrequested_line(const std::string& where) {
    const std::string shown = buffer_.size() > 80 ? buffer_.substr(0, 80) + "..." : buffer_;
    if (answered_.empty()) {
      fail(where, "the adapter wrote to stdout before it was asked anything: " + shown);
    }
    fail(answered_, "an unrequested line after the answer to this request" +
                        (answered_ == where ? std::string() : " (seen before " + where + " was sent)") +
                        ": an adapter writes exactly one line per request; it began: " + shown);
  }

  /// Reads what stdout holds now, without waiting.
  void read_stdout_now(const std::string& where) {
    for (int i = 0; i < 16; ++i) {
      pollfd fd = {from_child_, POLLIN, 0};
      if (::poll(&fd, 1, 0) <= 0 || fd.revents == 0) return;
      if (!read_stdout()) {
        if (!buffer_.empty()) return;  // reported as an unrequested line
        crashed(where, "the adapter closed its stdout" + exit_text());
      }
    }
  }

  /// One read from stdout into the line buffer; false at end of file.
  /// Waits until `deadline` for the adapter's stdout or stderr and reads
  /// what came (stderr kept for messages); false when stdout has closed.
  bool await_output(const std::string& where, Clock::time_point deadline) {
    pollfd fds[2] = {{from_child_, POLLIN, 0}, {err_child_, POLLIN, 0}};
    const int rc = ::poll(fds, 2, poll_ms(deadline));
    if (rc < 0 && errno != EINTR) fail(where, std::string("poll failed: ") + std::strerror(errno));
    if (rc <= 0) return true;
    if (fds[1].revents) read_stderr();
    if (fds[0].revents && !read_stdout()) {
      read_stderr();
      return false;
    }
    return true;
  }

  bool read_stdout() {
    const std::size_t old = buffer_.size();
    // Reads grow with the line (64 KB .. 1 MB), so short answers stay cheap.
    const std::size_t chunk = std::clamp(old, kChunkBytes, kMaxChunkBytes);
    if (buffer_.capacity() < old + chunk) {
      // Doubling, but never past the guard: a line at the guard costs the guard.
      buffer_.reserve(
          std::min(std::max(2 * buffer_.capacity(), old + chunk), kExecMaxLineBytes + kMaxChunkBytes));
    }
    buffer_.resize(old + chunk);
    ssize_t n;
    do {
      n = ::read(from_child_, buffer_.data() + old, chunk);
    } while (n < 0 && errno == EINTR);
    buffer_.resize(old + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    return n != 0;
  }

  /// Drains what stderr holds now into the ring (a bounded number of reads,
  /// so an adapter that floods stderr cannot hold kvcheck past a deadline).
  void read_stderr() noexcept {
    char chunk[kChunkBytes];
    for (int i = 0; i < 16 && err_child_ >= 0; ++i) {
      const ssize_t n = ::read(err_child_, chunk, sizeof chunk);
      if (n == 0) {
        ::close(err_child_);
        err_child_ = -1;
        return;
      }
      if (n < 0) return;
      keep_stderr(chunk, static_cast<std::size_t>(n));
    }
  }

  void keep_stderr(const char* data, std::size_t n) noexcept {
    if (n >= ring_.size()) {
      data += n - ring_.size();
      n = ring_.size();
    }
    for (std::size_t i = 0; i < n; ++i) {
      ring_[ring_head_] = data[i];
      ring_head_ = (ring_head_ + 1) % ring_.size();
    }
    ring_filled_ = std::min(ring_.size(), ring_filled_ + n);
  }

  std::string stderr_tail() const {
    std::string tail;
    tail.reserve(ring_filled_);
    const std::size_t start = (ring_head_ + ring_.size() - ring_filled_) % ring_.size();
    for (std::size_t i = 0; i < ring_filled_; ++i) tail.push_back(ring_[(start + i) % ring_.size()]);
    return tail;
  }

  /// Whether the adapter's shell has exited (a zombie, not yet reaped: its
  /// pid, and so its process group id, stays ours until stop() reaps it).
  bool exited(int* status) noexcept {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
    if (info.si_pid != pid_) return false;
    *status = info.si_code == CLD_EXITED ? info.si_status : -info.si_status;
    return true;
  }

  /// " (adapter exited with status N)" / " (adapter killed by signal N)" once it has ended.
  std::string exit_text() {
    if (pid_ <= 0) return "";
    int status = 0;
    bool done = false;
    for (int i = 0; i < 20 && !(done = exited(&status)); ++i) ::usleep(5000);
    if (!done) return "";
    if (status >= 0) return " (adapter exited with status " + std::to_string(status) + ")";
    return " (adapter killed by signal " + std::to_string(-status) + ")";
  }

  /// Closes stdin (the adapter's cue to exit), gives it half a second (its
  /// output drained and dropped), kills its process group, reaps it, and,
  /// once no adapter is left, every orphan it left behind.
  void stop() noexcept {
    if (to_child_ >= 0) {
      ::close(to_child_);
      to_child_ = -1;
    }
    if (pid_ > 0) {
      const auto deadline = Clock::now() + std::chrono::milliseconds(500);
      int status = 0;
      while (!exited(&status) && Clock::now() < deadline) {
        pollfd fds[2] = {{from_child_, POLLIN, 0}, {err_child_, POLLIN, 0}};
        if (::poll(fds, 2, 10) > 0) {
          if (fds[1].revents) read_stderr();
          if (fds[0].revents) {
            char scratch[kChunkBytes];
            if (::read(from_child_, scratch, sizeof scratch) == 0) {
              ::close(from_child_);
              from_child_ = -1;
            }
          }
        }
      }
      ::kill(-pid_, SIGKILL);
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      unregister_adapter(pid_);
      pid_ = -1;
    }
    close_all();
    const std::lock_guard<std::mutex> lock(g_spawn_mutex);
    if (!any_adapter()) sweep_orphans();
  }

  void close_all() noexcept {
    for (int* fd : {&to_child_, &from_child_, &err_child_}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }

  double timeout_seconds_;
  Clock::duration timeout_;
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1, err_child_ = -1;
  std::string buffer_;       // stdout bytes not yet returned as a line
  std::size_t scanned_ = 0;  // buffer_[0, scanned_) holds no '\n'
  std::string answered_;     // the request whose answer came last
  std::array<char, kExecStderrTailBytes> ring_{};
  std::size_t ring_head_ = 0;
  std::size_t ring_filled_ = 0;
};

}  // namespace

std::string ExecTransport::receive_bytes(std::size_t bytes, const std::string& where) {
  if (bytes > 0) fail(where, "this transport carries no binary frames");
  return {};
}

void ExecTransport::fail(const std::string& where, const std::string& what) {
  throw Error(ErrorId::kAdapter, where, on_failure(what));
}

void ExecTransport::crashed(const std::string& where, const std::string& what) {
  throw CacheCrash(ErrorId::kAdapter, where, on_failure(what), true);
}

std::unique_ptr<ExecTransport> start_exec_child(const std::string& command, double step_timeout_seconds) {
  return std::make_unique<ChildTransport>(command, step_timeout_seconds);
}

void kill_exec_children() noexcept {
  if (g_owner.load() != ::getpid()) return;
  const int saved_errno = errno;
  for (const auto& slot : g_adapters) {
    const pid_t group = slot.load();
    if (group > 0) ::kill(-group, SIGKILL);
  }
  // Wait until each shell is dead (not reaping it: its owner does), so that
  // its children have been handed to kvcheck before the sweep looks.
  for (const auto& slot : g_adapters) {
    const pid_t group = slot.load();
    if (group <= 0) continue;
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(group), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
    }
  }
  sweep_orphans();
  errno = saved_errno;
}

}  // namespace kvcheck::engines
