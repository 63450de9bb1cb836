#include "engines/exec_hello.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engines/exec_cache.hpp"
#include "support/error.hpp"

namespace kvcheck::engines {

namespace {

using Json = nlohmann::json;

constexpr const char* kWhere = "hello answer";

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorId::kAdapter, kWhere + path, what);
}

std::string quoted(const std::string& s) {
  return Json(s).dump();
}

std::string one_of(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + quoted(names[i]);
  return text;
}

/// Every key of `j` is one of `known`; a missing required key is an error.
void check_keys(const Json& j, const std::string& path, const std::vector<std::string>& required,
                const std::vector<std::string>& optional) {
  for (const std::string& k : required) {
    if (!j.contains(k)) bad(path + "." + k, "missing field");
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(required.begin(), required.end(), k) == required.end() &&
        std::find(optional.begin(), optional.end(), k) == optional.end()) {
      std::vector<std::string> all = required;
      all.insert(all.end(), optional.begin(), optional.end());
      bad(path + "." + k, "unknown key " + quoted(k) + " (kvcheck reads " + one_of(all) + ")");
    }
  }
}

/// A JSON integer in [lo, hi]: 2^64 - 1 (which nlohmann reads as unsigned)
/// and every other integer out of range is an error, never a wrapped value.
std::int64_t integer(const Json& v, const std::string& path, std::int64_t lo, std::int64_t hi) {
  if (!v.is_number_integer()) bad(path, "expected an integer");
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) {
    bad(path, "out of range: " + v.dump() + " (at most " + std::to_string(hi) + ")");
  }
  const std::int64_t x = v.get<std::int64_t>();
  if (x < lo || x > hi) {
    bad(path, "out of range: " + v.dump() + " (" + std::to_string(lo) + " .. " + std::to_string(hi) + ")");
  }
  return x;
}

bool boolean(const Json& v, const std::string& path) {
  if (!v.is_boolean()) bad(path, "expected true or false");
  return v.get<bool>();
}

std::string text(const Json& v, const std::string& path) {
  if (!v.is_string()) bad(path, "expected a string");
  return v.get<std::string>();
}

/// An array of distinct names, each one of `known`.
std::vector<std::string> names(const Json& v, const std::string& path, const std::vector<std::string>& known,
                               bool allow_empty) {
  if (!v.is_array()) bad(path, "expected an array of strings");
  if (v.empty() && !allow_empty) bad(path, "empty: expected at least one of " + one_of(known));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string pi = path + "[" + std::to_string(i) + "]";
    const std::string s = text(v[i], pi);
    if (std::find(known.begin(), known.end(), s) == known.end()) {
      bad(pi, "unknown name " + quoted(s) + " (one of " + one_of(known) + ")");
    }
    if (std::find(out.begin(), out.end(), s) != out.end()) bad(pi, quoted(s) + " listed twice");
    out.push_back(s);
  }
  return out;
}

bool has(const std::vector<std::string>& v, const char* x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();
// Sizes of one head (head_dim, rotary widths) are 32-bit in scenario files.
constexpr std::int64_t kMaxDim = std::numeric_limits<std::int32_t>::max();
// Lookahead slots and free deferral steps: engines declare a handful (vLLM's
// num_speculative_tokens, SGLang's eviction interval of up to a window);
// more than 2^16 is a mistake, and the pool it would ask for is refused here.
constexpr std::int64_t kMaxSlackSteps = std::int64_t{1} << 16;

/// `[64, 128]` or `{"multiple_of": 8, "min": 8, "max": 256}`.
SizeSet size_set(const Json& v, const std::string& path) {
  SizeSet set;
  if (v.is_array()) {
    if (v.empty()) bad(path, "empty: list at least one size");
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::string pi = path + "[" + std::to_string(i) + "]";
      const std::int64_t x = integer(v[i], pi, 1, kMaxDim);
      if (std::find(set.values.begin(), set.values.end(), x) != set.values.end()) bad(pi, "listed twice");
      set.values.push_back(x);
    }
    std::sort(set.values.begin(), set.values.end());
    return set;
  }
  if (!v.is_object()) bad(path, "expected an array of sizes or an object {multiple_of, min, max}");
  check_keys(v, path, {}, {"multiple_of", "min", "max"});
  if (v.contains("multiple_of"))
    set.multiple_of = integer(v["multiple_of"], path + ".multiple_of", 1, kMaxDim);
  if (v.contains("min")) set.min = integer(v["min"], path + ".min", 1, kMaxDim);
  if (v.contains("max")) set.max = integer(v["max"], path + ".max", 1, kMaxDim);
  if (set.max > 0 && set.max < set.min) bad(path + ".max", "below min " + std::to_string(set.min));
  if (!set.smallest_at_least(1)) bad(path, "no size satisfies these rules");
  return set;
}

/// The hello's step names, from the tables of scenarios/step_kinds.hpp: each
/// kind in table order, a kind with an order field as its capability rows
/// ("prefill_load_then_store", ...), every other kind by its name.
std::vector<std::string> hello_step_names() {
  std::vector<std::string> out;
  for (const scenarios::StepKind kind : scenarios::kStepKinds) {
    if (scenarios::step_kind_fields(kind) != scenarios::StepFields::kRowsOrder) {
      out.emplace_back(scenarios::step_kind_name(kind));
      continue;
    }
    for (int i = 0; i < scenarios::kStepCapabilityCount; ++i) {
      const auto& c = scenarios::step_capability_info(static_cast<scenarios::StepCapability>(i));
      if (c.kind == kind) out.emplace_back(c.name);
    }
  }
  return out;
}

const std::vector<std::string> kSteps = hello_step_names();
/// The format names, from the table of support/formats.hpp.
std::vector<std::string> hello_format_names() {
  std::vector<std::string> out;
  for (const ElementFormat f : kElementFormats) out.emplace_back(format_name(f));
  return out;
}

const std::vector<std::string> kFormats = hello_format_names();
const std::vector<std::string> kRope = {"none", "neox", "interleaved"};
const std::vector<std::string> kLayouts = {"mha", "gqa", "mqa", "shared"};
const std::vector<std::string> kAddressing = {"ring", "paged", "opaque"};
const std::vector<std::string> kProbes = {"accept-without-verify", "accept-too-many", "begin-busy-state"};
const std::vector<std::string> kAccumulation = {"f32", "f64"};
const std::vector<std::string> kProbabilityRounding = {"none", "bf16", "fp16"};

/// The output formats a hello may declare (support/formats.hpp's table,
/// less "accumulation", which is what declaring none means).
std::vector<std::string> hello_output_format_names() {
  std::vector<std::string> out;
  for (const OutputFormat f : kOutputFormats) {
    if (f != OutputFormat::kAccumulation) out.emplace_back(output_format_name(f));
  }
  return out;
}

const std::vector<std::string> kOutputFormatNames = hello_output_format_names();

std::string pick(const Json& v, const std::string& path, const std::vector<std::string>& known) {
  const std::string s = text(v, path);
  if (std::find(known.begin(), known.end(), s) == known.end()) {
    bad(path, "unknown value " + quoted(s) + " (one of " + one_of(known) + ")");
  }
  return s;
}

const std::vector<std::string> kResidentUnits = {"rows", "blocks"};
const std::vector<std::string> kResidentScopes = {"request", "cache"};

/// "resident_bound": {"unit": "rows"|"blocks", "per": "request"|"cache",
/// "limit": N}; per defaults to "cache", limit to what kvcheck gives the case.
/// Blocks need the block size (read before this).
void read_resident_bound(const Json& b, const std::string& path, Capabilities* c) {
  if (!b.is_object()) bad(path, "expected an object {unit, per, limit}");
  check_keys(b, path, {"unit"}, {"per", "limit"});
  const bool blocks = pick(b["unit"], path + ".unit", kResidentUnits) == "blocks";
  if (blocks && c->block_size < 1) {
    bad(path + ".unit", "a bound in blocks needs \"addressing\": \"paged\" with a block_size");
  }
  c->resident_bound.unit = blocks ? ResidentBound::Unit::kBlocks : ResidentBound::Unit::kRows;
  c->resident_bound.per_request = b.contains("per") && pick(b["per"], path + ".per", kResidentScopes) == "request";
  if (b.contains("limit")) c->resident_bound.limit = integer(b["limit"], path + ".limit", 1, kMaxInt64);
}

void read_capabilities(const Json& caps, Capabilities* out) {
  const std::string p = ".capabilities";
  if (!caps.is_object()) bad(p, "expected an object");
  check_keys(caps, p, {"steps", "formats", "rope", "layouts"},
             {"sink",
              "softmax_scale",
              "partial_rope",
              "sliding_window",
              "per_layer_windows",
              "prefix_sharing",
              "recompute_in_step",
              "head_dim",
              "rotary_dims",
              "max_head_dim",
              "max_states",
              "max_layers",
              "max_step_rows",
              "max_heads",
              "max_kv_heads",
              "max_window_keys",
              "max_positions",
              "accumulation",
              "probabilities_rounded_to",
              "output_format",
              "outputs",
              "reports",
              "addressing",
              "block_size",
              "resident_bound",
              "lookahead_slots",
              "free_deferral_steps",
              "shared_pool",
              "probes"});
  Capabilities& c = *out;
  const auto steps = names(caps["steps"], p + ".steps", kSteps, false);
  if (has(steps, "verify") != has(steps, "accept")) {
    bad(p + ".steps", "verify and accept come together (accept ends a verify): list both or neither");
  }
  bool writes = false;  // some step that writes rows
#define KVCHECK_HELLO_STEP(id, member, kind, order)                                         \
  c.member = has(steps, #member);                                                          \
  writes = writes || (c.member && scenarios::step_kind_writes_rows(scenarios::StepKind::kind));
  KVCHECK_STEP_CAPABILITIES(KVCHECK_HELLO_STEP)
#undef KVCHECK_HELLO_STEP
  if (!writes) {
    bad(p + ".steps", "no step that writes rows (prefill, decode or verify)");
  }
  c.formats.clear();
  for (const auto& f : names(caps["formats"], p + ".formats", kFormats, false)) {
    ElementFormat format = ElementFormat::kF64;
    parse_format(f, &format);  // a name of kFormats: always parses
    c.formats.push_back(format);
  }
  c.rope_styles.clear();
  for (const auto& s : names(caps["rope"], p + ".rope", kRope, false)) {
    c.rope_styles.push_back(s == "none"   ? scenarios::RopeStyle::kNone
                            : s == "neox" ? scenarios::RopeStyle::kNeox
                                          : scenarios::RopeStyle::kInterleaved);
  }
  const auto layouts = names(caps["layouts"], p + ".layouts", kLayouts, false);
  c.gqa = has(layouts, "gqa") && has(layouts, "mqa");
  c.shared_row = has(layouts, "shared");
  auto flag = [&](const char* key, bool fallback) {
    return caps.contains(key) ? boolean(caps[key], p + "." + key) : fallback;
  };
  auto limit = [&](const char* key) {
    return caps.contains(key) ? integer(caps[key], p + "." + key, 0, kMaxInt64) : std::int64_t{0};
  };
  c.sink = flag("sink", false);
  c.softmax_scale = flag("softmax_scale", false);
  c.partial_rope = flag("partial_rope", true);
  c.full_window_only = !flag("sliding_window", true);
  c.per_layer_windows = flag("per_layer_windows", false);
  c.prefix_sharing = flag("prefix_sharing", false);
  // Prefix rows left by a begin to the request's next step (docs/semantics.md "Recompute in a step").
  c.recompute_in_step = flag("recompute_in_step", false);
  if (caps.contains("head_dim") && caps.contains("max_head_dim")) {
    bad(p + ".max_head_dim", "give head_dim or max_head_dim, not both (head_dim: {\"max\": N})");
  }
  if (caps.contains("head_dim")) c.head_dims = size_set(caps["head_dim"], p + ".head_dim");
  if (caps.contains("max_head_dim")) {
    c.head_dims.max = integer(caps["max_head_dim"], p + ".max_head_dim", 0, kMaxDim);
  }
  if (caps.contains("rotary_dims")) c.rotary_dims = size_set(caps["rotary_dims"], p + ".rotary_dims");
  c.max_states = limit("max_states");
  c.max_layers = std::min<std::int64_t>(limit("max_layers"), std::numeric_limits<std::int32_t>::max());
  c.max_step_rows = limit("max_step_rows");
  c.max_heads = limit("max_heads");
  c.max_kv_heads = limit("max_kv_heads");
  c.max_window_keys = limit("max_window_keys");
  c.max_positions = limit("max_positions");
  if (caps.contains("accumulation")) {
    c.accumulation = pick(caps["accumulation"], p + ".accumulation", kAccumulation) == "f32"
                         ? Accumulation::kF32
                         : Accumulation::kF64;
  }
  if (caps.contains("probabilities_rounded_to")) {
    const std::string r =
        pick(caps["probabilities_rounded_to"], p + ".probabilities_rounded_to", kProbabilityRounding);
    c.probabilities_rounded_to = r == "bf16"   ? ProbabilityRounding::kBf16
                                 : r == "fp16" ? ProbabilityRounding::kFp16
                                               : ProbabilityRounding::kNone;
  }
  if (caps.contains("output_format")) {
    const std::string f = pick(caps["output_format"], p + ".output_format", kOutputFormatNames);
    parse_output_format(f, &c.output_format);  // a name of kOutputFormatNames: always parses
  }
  c.reports_written_slots = c.reports_read_slots = false;
  if (caps.contains("reports")) {
    const Json& rep = caps["reports"];
    const std::string pr = p + ".reports";
    if (!rep.is_object()) bad(pr, "expected an object {written_slots, read_slots}");
    check_keys(rep, pr, {}, {"written_slots", "read_slots", "frees", "cached"});
    if (rep.contains("written_slots"))
      c.reports_written_slots = boolean(rep["written_slots"], pr + ".written_slots");
    if (rep.contains("read_slots")) c.reports_read_slots = boolean(rep["read_slots"], pr + ".read_slots");
    if (rep.contains("frees")) c.reports_frees = boolean(rep["frees"], pr + ".frees");
    if (rep.contains("cached")) c.reports_cached = boolean(rep["cached"], pr + ".cached");
  }
  c.computes_outputs = flag("outputs", true);
  if (!c.computes_outputs) {
    if (!c.reports_written_slots || !c.reports_read_slots) {
      bad(p + ".outputs",
          "an engine that computes no outputs must report written and read slots "
          "(reports: {\"written_slots\": true, \"read_slots\": true}): kvcheck computes its outputs from "
          "them");
    }
    if (caps.contains("accumulation") || caps.contains("probabilities_rounded_to") ||
        caps.contains("output_format")) {
      bad(p + ".outputs",
          "an engine that computes no outputs has no accumulation, probability rounding or output format");
    }
    c.accumulation = Accumulation::kF64;  // kvcheck computes them, in binary64
  }
  const std::string addressing =
      caps.contains("addressing") ? pick(caps["addressing"], p + ".addressing", kAddressing) : "opaque";
  c.ring_addressing = addressing == "ring";
  c.slots_in_pool = true;  // PROTOCOL.md "Capacity": the pool open gives
  // Paged addressing with a block size: slot = block * block_size + offset,
  // and open carries the pool in blocks. "paged" without a block size stays
  // opaque slots, as before block sizes were declared.
  if (caps.contains("block_size")) {
    if (addressing != "paged") {
      bad(p + ".block_size", "a block size needs \"addressing\": \"paged\" (addressing is " + quoted(addressing) + ")");
    }
    c.block_size = integer(caps["block_size"], p + ".block_size", 1, kMaxDim);
  }
  if (caps.contains("resident_bound")) read_resident_bound(caps["resident_bound"], p + ".resident_bound", &c);
  // Declared slack (docs/semantics.md "Lookahead slots and deferred frees").
  if (caps.contains("lookahead_slots")) {
    c.lookahead_slots = integer(caps["lookahead_slots"], p + ".lookahead_slots", 0, kMaxSlackSteps);
    if (c.lookahead_slots > 0 && c.block_size < 1) {
      bad(p + ".lookahead_slots",
          "lookahead slots need \"addressing\": \"paged\" with a block_size (they are room in the pool "
          "kvcheck sizes in blocks)");
    }
  }
  if (caps.contains("free_deferral_steps")) {
    c.free_deferral_steps =
        integer(caps["free_deferral_steps"], p + ".free_deferral_steps", 0, kMaxSlackSteps);
    if (!c.reports_frees) {
      bad(p + ".free_deferral_steps",
          "a free deferral needs frees reported (reports: {\"frees\": true}): kvcheck judges each free's "
          "deadline");
    }
  }
  // One pool of slots across the layers (docs/semantics.md "One pool across layers").
  c.shared_pool = flag("shared_pool", false);
  if (c.shared_pool && c.ring_addressing) {
    bad(p + ".shared_pool",
        "a pool shared by the layers needs \"addressing\": \"paged\" or \"opaque\" (a ring's slots are "
        "state * capacity + position mod capacity, one ring per layer)");
  }
  if (caps.contains("probes")) c.probes = names(caps["probes"], p + ".probes", kProbes, true);
}

}  // namespace

const char* exec_encoding_name(ExecEncoding encoding) noexcept {
  return encoding == ExecEncoding::kBinary ? "binary" : "json";
}

Json hello_request(ExecEncoding offer) {
  Json request{{"op", "hello"}, {"protocol", kExecProtocolName}, {"version", kExecProtocolVersion}};
  // Offered only when asked for: an adapter that reads hello strictly and
  // predates binary frames gets the very line it always got.
  if (offer == ExecEncoding::kBinary) request["encodings"] = Json::array({"binary", "json"});
  return request;
}

Capabilities parse_hello_answer(const Json& answer, const std::string& command, ExecEncoding offered,
                                ExecEncoding* encoding) {
  if (!answer.is_object()) bad("", "expected a JSON object");
  check_keys(answer, "", {"ok", "protocol", "version", "capabilities"}, {"name", "encoding"});
  if (!boolean(answer["ok"], ".ok")) bad(".ok", "expected true (a refusal has no capabilities)");
  const std::string protocol = text(answer["protocol"], ".protocol");
  if (protocol != kExecProtocolName) {
    bad(".protocol", "protocol " + quoted(protocol) + ", kvcheck speaks " + quoted(kExecProtocolName));
  }
  const std::int64_t version =
      integer(answer["version"], ".version", std::numeric_limits<std::int64_t>::min(), kMaxInt64);
  if (version != kExecProtocolVersion) {
    bad(".version", "protocol version " + std::to_string(version) + ", kvcheck speaks " +
                        std::to_string(kExecProtocolVersion));
  }
  Capabilities caps;
  caps.name = "exec:" + command;
  if (answer.contains("name")) {
    const std::string name = text(answer["name"], ".name");
    if (name.empty()) bad(".name", "empty");
    caps.name = "exec:" + name;
  }
  read_capabilities(answer["capabilities"], &caps);
  ExecEncoding chosen = ExecEncoding::kJson;
  if (answer.contains("encoding")) {
    const std::vector<std::string> offer = offered == ExecEncoding::kBinary
                                               ? std::vector<std::string>{"binary", "json"}
                                               : std::vector<std::string>{};
    const std::string name = text(answer["encoding"], ".encoding");
    if (offer.empty()) {
      bad(".encoding", "kvcheck offered no encodings (it offers binary frames with --exec-encoding binary), got " +
                           quoted(name));
    }
    if (std::find(offer.begin(), offer.end(), name) == offer.end()) {
      bad(".encoding", "unknown encoding " + quoted(name) + " (kvcheck offered " + one_of(offer) + ")");
    }
    if (name == "binary") chosen = ExecEncoding::kBinary;
  }
  if (encoding) *encoding = chosen;
  return caps;
}

}  // namespace kvcheck::engines
