// Engines as external processes: `--impl exec:'COMMAND ARGS'`. kvcheck starts
// COMMAND with /bin/sh -c as a child (its own process group) and speaks the
// versioned JSON Lines protocol of adapters/PROTOCOL.md over its stdin and
// stdout (schema: scenarios/schema/exec-protocol.schema.json); rows and
// outputs travel as JSON numbers or, when negotiated at hello, as binary
// frames after the JSON header lines (read as strictly).
//
// One provider owns one child and reuses it for every run (open ... close),
// so process start-up is paid once per worker thread. A misbehaving adapter
// (a crash, a line that is not JSON, a missing or mistyped field, wrong
// shapes, NaN, no answer within the step timeout) ends the run with
// kvcheck::Error(kAdapter) naming the step and the JSON path, followed by the
// tail of the adapter's stderr. The child process and its pipes are
// engines/exec_transport.hpp: no adapter can hang kvcheck, and nothing it
// starts outlives kvcheck.
#pragma once

#include <memory>
#include <string>

#include "engines/cache_under_test.hpp"
#include "engines/exec_hello.hpp"
#include "engines/exec_transport.hpp"

namespace kvcheck::engines {

/// Options of exec providers.
struct ExecOptions {
  double step_timeout_seconds = 10.0;  ///< per answer, hello and open included
  /// What hello offers: kBinary offers binary frames, which the adapter may
  /// take or leave (JSON then); the verdicts and reports are the same.
  ExecEncoding encoding = ExecEncoding::kJson;
};

/// The protocol version this build speaks.
inline constexpr int kExecProtocolVersion = 1;

/// Starts `command` and performs the hello handshake. Throws kvcheck::Error
/// (kAdapter) when the command cannot start or answers badly.
std::unique_ptr<CacheProvider> make_exec_provider(const std::string& command, const ExecOptions& options);

/// The same provider over a transport the caller made (the answer-parser
/// fuzzer feeds answers from memory); `name` stands for the command;
/// `offer` is what hello offers (ExecOptions::encoding).
std::unique_ptr<CacheProvider> make_exec_provider(std::unique_ptr<ExecTransport> transport, const std::string& name,
                                                  ExecEncoding offer = ExecEncoding::kJson);

}  // namespace kvcheck::engines
