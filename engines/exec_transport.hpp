// The line transport of exec engines (adapters/PROTOCOL.md): one request line
// to the adapter's stdin, one answer line back from its stdout. The child's
// three pipes are non-blocking and polled together, so kvcheck never waits on
// an adapter that waits on kvcheck: while a request is written or an answer
// awaited, stderr is drained into a bounded ring (its tail ends every error)
// and stdout is watched for lines nobody asked for. Every send and every
// answer has a deadline (--step-timeout). Answers are scanned for '\n' once
// per byte (time linear in the line, memory the line itself) up to a 1 GiB
// line guard. A binary frame after an answer line (adapters/PROTOCOL.md
// "Binary frames") is read as exactly the bytes its header announced, under
// the same deadline and a 1 GiB frame guard.
//
// No process the adapter starts outlives kvcheck: the adapter runs in its own
// process group; kvcheck is made a child subreaper (PR_SET_CHILD_SUBREAPER),
// so a grandchild that leaves the group (setsid) becomes kvcheck's child when
// its parent dies, and is killed and reaped with the group; SIGINT, SIGTERM
// and SIGHUP (when their disposition is the default) and exit() do the same
// for every adapter still running before kvcheck ends with the signal's
// conventional status.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace kvcheck::engines {

/// One exchange channel to an exec adapter. Every failure throws
/// kvcheck::Error(kAdapter) at `where` ("hello", "steps[3] (decode, layer 0)")
/// after the adapter's processes are gone.
class ExecTransport {
 public:
  virtual ~ExecTransport() = default;
  /// Writes one request line (ending in '\n') within the deadline.
  virtual void send(std::string_view line, const std::string& where) = 0;
  /// The next answer line (without its '\n') within the deadline; bytes
  /// after it are an unrequested line.
  virtual std::string receive(const std::string& where) = 0;
  /// The next answer line (without its '\n') within the deadline, leaving
  /// the bytes after it for receive_bytes(): the header of an answer that may
  /// carry a binary frame (adapters/PROTOCOL.md "Binary frames").
  virtual std::string receive_header(const std::string& where) { return receive(where); }
  /// Exactly `bytes` more bytes of the answer (its frame; 0 for none) within
  /// the deadline; bytes after them are an unrequested line. The caller has
  /// checked `bytes` against what the answer may hold (kExecMaxFrameBytes at
  /// most): memory grows with the bytes that arrive, never with the claim.
  virtual std::string receive_bytes(std::size_t bytes, const std::string& where);
  /// Stops the adapter and throws Error(kAdapter, where, what + stderr tail).
  [[noreturn]] void fail(const std::string& where, const std::string& what);
  /// The adapter's process ended (it closed its stdout, or stopped taking
  /// requests because it exited): stops what is left of it and throws
  /// CacheCrash(kAdapter, where, what + stderr tail, spent), a finding of the
  /// run that was going on (engines/cache_under_test.hpp).
  [[noreturn]] void crashed(const std::string& where, const std::string& what);

 protected:
  /// Ends the exchange for fail(): stops the adapter; returns `what` with
  /// whatever the error message should add (the tail of its stderr).
  virtual std::string on_failure(const std::string& what) = 0;
};

/// Longest answer line read (bytes, '\n' excluded).
inline constexpr std::size_t kExecMaxLineBytes = std::size_t{1} << 30;
/// Largest binary frame read (bytes).
inline constexpr std::size_t kExecMaxFrameBytes = std::size_t{1} << 30;
/// Bytes of the adapter's stderr kept for error messages.
inline constexpr std::size_t kExecStderrTailBytes = 2048;

/// Starts `command` with /bin/sh -c in its own process group. Throws
/// Error(kAdapter) at "--impl" when it cannot start.
std::unique_ptr<ExecTransport> start_exec_child(const std::string& command, double step_timeout_seconds);

/// Kills every process group of a running adapter and every process that
/// became kvcheck's child (orphaned descendants), then reaps them.
/// Async-signal-safe; what the signal handlers and exit() run.
void kill_exec_children() noexcept;

}  // namespace kvcheck::engines
