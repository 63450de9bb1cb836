// The exec protocol's handshake, read strictly (adapters/PROTOCOL.md
// "hello"): the hello answer becomes the engine's Capabilities, or a
// kvcheck::Error (kAdapter) naming the JSON path at fault. Every key kvcheck
// reads is listed in scenarios/schema/exec-protocol.schema.json; any other
// key, and any unknown step, format, RoPE style, layout, addressing or probe
// name, is an error, so a misspelling never narrows the check in silence.
// A pure function of the parsed line (no process), so it is tested and
// fuzzed on its own.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "engines/cache_under_test.hpp"

namespace kvcheck::engines {

/// The protocol name kvcheck and its adapters speak.
inline constexpr const char* kExecProtocolName = "kvcheck-exec";

/// Reads an `ok:true` hello answer. `command` names the engine when the
/// answer has no `name`. Throws kvcheck::Error(kAdapter) at
/// "hello answer.PATH" (e.g. "hello answer.capabilities.steps[2]").
Capabilities parse_hello_answer(const nlohmann::json& answer, const std::string& command);

}  // namespace kvcheck::engines
