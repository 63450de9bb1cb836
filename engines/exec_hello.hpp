// The exec protocol's handshake, read strictly (adapters/PROTOCOL.md
// "hello"): the hello answer becomes the engine's Capabilities, or a
// kvcheck::Error (kAdapter) naming the JSON path at fault. Every key kvcheck
// reads is listed in scenarios/schema/exec-protocol.schema.json; any other
// key, and any unknown step, format, RoPE style, layout, addressing or probe
// name, is an error, so a misspelling never narrows the check in silence.
// A pure function of the parsed line (no process), so it is tested and
// fuzzed on its own. The handshake also settles how rows travel afterwards:
// JSON unless kvcheck offered binary frames and the adapter chose them.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "engines/cache_under_test.hpp"

namespace kvcheck::engines {

/// The protocol name kvcheck and its adapters speak.
inline constexpr const char* kExecProtocolName = "kvcheck-exec";

/// How rows and outputs travel after the handshake (adapters/PROTOCOL.md
/// "Binary frames"): JSON numbers (the default and the reference), or
/// little-endian binary frames after each JSON header line.
enum class ExecEncoding : std::uint8_t {
  kJson,    ///< "json": rows as JSON arrays of numbers
  kBinary,  ///< "binary": rows as a frame of f64 (answers: f64 or f32) after the header line
};

/// "json" or "binary".
const char* exec_encoding_name(ExecEncoding encoding) noexcept;

/// The hello request. With `offer` kBinary it offers binary frames
/// ("encodings": ["binary", "json"]); with kJson it offers nothing, so the
/// line is the one every adapter of protocol version 1 reads.
nlohmann::json hello_request(ExecEncoding offer);

/// Reads an `ok:true` hello answer. `command` names the engine when the
/// answer has no `name`. `offered` is what hello_request offered; the
/// answer's "encoding" (one of the offer; absent: JSON) goes to `*encoding`
/// when given. Throws kvcheck::Error(kAdapter) at "hello answer.PATH"
/// (e.g. "hello answer.capabilities.steps[2]").
Capabilities parse_hello_answer(const nlohmann::json& answer, const std::string& command,
                                ExecEncoding offered = ExecEncoding::kJson, ExecEncoding* encoding = nullptr);

}  // namespace kvcheck::engines
