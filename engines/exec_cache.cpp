#include "engines/exec_cache.hpp"

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "engines/exec_hello.hpp"
#include "engines/exec_transport.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

namespace kvcheck::engines {

namespace {

using Json = nlohmann::json;

// ---- reading answers: every check names the JSON path -----------------------

struct Reader {
  ExecTransport& child;
  std::string where;  // "hello", "steps[3] (decode)", ...

  [[noreturn]] void bad(const std::string& path, const std::string& what) const {
    child.fail(where + " answer" + path, what);
  }

  Json parse(const std::string& line) const {
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      const std::string shown = line.size() > 120 ? line.substr(0, 120) + "..." : line;
      bad("",
          "the line is not JSON (NaN and Infinity are not JSON; an adapter writes only protocol lines to "
          "stdout and logs to stderr): " +
              shown);
    }
    if (!j.is_object()) bad("", "expected a JSON object");
    return j;
  }

  const Json& field(const Json& j, const std::string& path, const char* key) const {
    const auto it = j.find(key);
    if (it == j.end()) bad(path + "." + key, "missing field");
    return *it;
  }

  bool boolean(const Json& j, const std::string& path, const char* key) const {
    const Json& v = field(j, path, key);
    if (!v.is_boolean()) bad(path + "." + key, "expected true or false");
    return v.get<bool>();
  }

  std::string text(const Json& j, const std::string& path, const char* key) const {
    const Json& v = field(j, path, key);
    if (!v.is_string()) bad(path + "." + key, "expected a string");
    return v.get<std::string>();
  }

  std::int64_t integer(const Json& v, const std::string& path) const {
    if (!v.is_number_integer()) bad(path, "expected an integer");
    // nlohmann reads 2^63 .. 2^64 - 1 as unsigned: never a wrapped value.
    if (v.is_number_unsigned() &&
        v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      bad(path, "out of range: " + v.dump() + " (a signed 64-bit integer)");
    }
    return v.get<std::int64_t>();
  }

  /// A slot: any signed 64-bit integer is well-formed. Whether the cache
  /// has that slot (not negative but for a -1 the protocol gives a meaning,
  /// inside the pool it was opened with) is judged by the checker, which
  /// fails the case at the step (properties/runner.cpp slots_possible): an
  /// impossible slot is the cache's mistake, not a malformed answer.
  std::int64_t slot(const Json& v, const std::string& path) const { return integer(v, path); }

  /// An integer in [lo, hi].
  std::int64_t integer(const Json& v, const std::string& path, std::int64_t lo, std::int64_t hi) const {
    const std::int64_t x = integer(v, path);
    if (x < lo || x > hi) {
      bad(path, "out of range: " + std::to_string(x) + " (" + std::to_string(lo) + " .. " + std::to_string(hi) + ")");
    }
    return x;
  }

  double number(const Json& v, const std::string& path) const {
    if (!v.is_number()) bad(path, "expected a number");
    const double x = v.get<double>();
    if (!std::isfinite(x)) bad(path, "not a finite number");
    return x;
  }

  /// Checks ok; a refusal becomes a Refusal.
  std::optional<Refusal> status(const Json& j) const {
    if (boolean(j, "", "ok")) return std::nullopt;
    Refusal r;
    if (j.contains("refused")) {
      r.code = "refused";
      r.detail = text(j, "", "refused");
    } else {
      r.code = text(j, "", "error");
      if (j.contains("detail")) r.detail = text(j, "", "detail");
    }
    return r;
  }
};

std::string op_text(const StepCall& c) {
  return c.op == StepCall::Op::kBegin ? std::string("begin")
                                      : std::string(scenarios::step_kind_name(c.step.kind));
}

Json rows_json(const double* x, std::int64_t rows, std::int64_t width) {
  Json out = Json::array();
  for (std::int64_t i = 0; i < rows; ++i) {
    Json row = Json::array();
    for (std::int64_t d = 0; d < width; ++d) row.push_back(x[i * width + d]);
    out.push_back(std::move(row));
  }
  return out;
}

// ---- binary frames (adapters/PROTOCOL.md "Binary frames") -------------------
//
// After a hello that chose "binary", a request or answer line may announce a
// frame: {"dtype": "f64", "bytes": B, "arrays": [[name, rows, width], ...]},
// and exactly B bytes follow its '\n': the arrays in the order listed,
// row-major, little-endian. kvcheck sends f64 rows; an answer may send f64
// or f32.

/// Appends `count` binary64 values, little-endian.
void append_f64_le(std::string& out, const double* x, std::size_t count) {
  const std::size_t at = out.size();
  out.resize(at + count * 8);
  char* p = out.data() + at;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, x, count * 8);
  } else {
    for (std::size_t i = 0; i < count; ++i) {
      const auto bits = std::bit_cast<std::uint64_t>(x[i]);
      for (int b = 0; b < 8; ++b) p[i * 8 + b] = static_cast<char>(bits >> (8 * b));
    }
  }
}

/// The little-endian element at `p` (8 bytes: binary64, 4: binary32) as a double.
double load_le(const char* p, std::size_t element_bytes) {
  std::uint64_t bits = 0;
  for (std::size_t b = element_bytes; b-- > 0;) bits = bits << 8 | static_cast<unsigned char>(p[b]);
  if (element_bytes == 8) return std::bit_cast<double>(bits);
  return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
}

/// An array an answer's frame may carry: its name, the shape it must have,
/// where its values go, and whether the frame held it.
struct FrameArray {
  const char* name;  // "out", "stored.k", "stored.v": the JSON path it stands for
  std::int64_t rows;
  std::int64_t width;
  std::vector<double>* values;
  bool present = false;
};

/// The optional slot events of an ok step answer (adapters/PROTOCOL.md
/// "Padding, moves and frees"): "padded", "freed" and "cached" lists of
/// slots, "moved" a list of [from, to] pairs. "cached" only from a cache
/// that declared it (hello "reports": {"cached": true}).
void read_slot_events(const Json& j, const Reader& r, bool cached_declared, StepAnswer* answer) {
  const auto slots = [&](const char* key, std::vector<std::int64_t>& into) {
    if (!j.contains(key)) return;
    const std::string pk = std::string(".") + key;
    const Json& list = j[key];
    if (!list.is_array()) r.bad(pk, "expected an array of slots");
    for (std::size_t i = 0; i < list.size(); ++i) into.push_back(r.slot(list[i], pk + "[" + std::to_string(i) + "]"));
  };
  slots("padded", answer->padded);
  slots("freed", answer->freed);
  if (j.contains("cached") && !cached_declared)
    r.bad(".cached",
          "cached slots from a cache that did not declare them (hello \"reports\": {\"cached\": true})");
  slots("cached", answer->cached);
  if (!j.contains("moved")) return;
  const Json& moved = j["moved"];
  if (!moved.is_array()) r.bad(".moved", "expected an array of [from, to] slot pairs");
  for (std::size_t i = 0; i < moved.size(); ++i) {
    const std::string pi = ".moved[" + std::to_string(i) + "]";
    if (!moved[i].is_array() || moved[i].size() != 2) r.bad(pi, "expected [from, to]: two slots");
    answer->moved.emplace_back(r.slot(moved[i][0], pi + "[0]"), r.slot(moved[i][1], pi + "[1]"));
  }
}

class ExecProvider;

class ExecCache final : public CacheUnderTest {
 public:
  ExecCache(ExecProvider& provider, const CacheSpec& spec) : provider_(provider), spec_(spec) {}
  ~ExecCache() override;
  StepStatus call(const StepCall& c, StepAnswer* answer) override;

 private:
  ExecProvider& provider_;
  CacheSpec spec_;
};

class ExecProvider final : public CacheProvider {
 public:
  /// `restart`: how to start the adapter again after it crashed (empty for
  /// a transport handed in, which cannot be restarted).
  /// `offer`: what hello offers (ExecOptions::encoding).
  ExecProvider(const std::string& command, std::unique_ptr<ExecTransport> transport,
               std::function<std::unique_ptr<ExecTransport>()> restart = {},
               ExecEncoding offer = ExecEncoding::kJson)
      : command_(command), transport_(std::move(transport)), restart_(std::move(restart)), offer_(offer) {
    hello();
  }

  const Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return "exec:" + command_; }

  std::unique_ptr<CacheUnderTest> open(const CacheSpec& spec, Refusal* refused) override {
    if (spent_ && restart_) {
      // The adapter crashed in an earlier run (a finding of that run): this
      // run gets a new process. The capabilities stay those of the first
      // hello, which the check's cases were drawn from.
      const Capabilities first = caps_;
      transport_ = restart_();
      spent_ = false;
      hello();
      caps_ = first;
    }
    const auto& c = spec.cache;
    Json s;
    s["states"] = c.states;
    s["capacity"] = c.ring_rows;
    if (caps_.block_size > 0) {
      // Paged addressing: the pool in blocks of the declared size (the sweep
      // sets pool_blocks; otherwise it is derived from the capacity).
      const std::int64_t blocks = paged_pool_blocks(spec, caps_);
      if (blocks < 1) {
        throw Error(ErrorId::kSize, "spec.pool_blocks", "a paged pool needs at least one block, got " +
                                                            std::to_string(blocks));
      }
      s["block_size"] = caps_.block_size;
      s["pool_blocks"] = blocks;
    }
    s["window"] = {{"param", c.window},
                   {"convention", scenarios::convention_name(c.convention)},
                   {"keys", spec.window_keys}};
    if (!c.layer_windows.empty()) {
      // Only when the scenario lists them (a cache that declared
      // per_layer_windows): other open lines keep their text.
      Json layers = Json::array();
      for (std::size_t l = 0; l < c.layer_windows.size(); ++l) {
        const scenarios::LayerWindow& w = c.layer_windows[l];
        if (w.window) {
          layers.push_back({{"param", *w.window},
                            {"convention", scenarios::convention_name(w.convention)},
                            {"keys", spec.layer_window_keys[l]}});
        } else {
          layers.push_back({{"param", nullptr}, {"convention", nullptr}, {"keys", nullptr}});
        }
      }
      s["layer_windows"] = std::move(layers);
    }
    s["q_heads"] = c.q_heads;
    s["kv_heads"] = c.kv_heads;
    s["head_dim"] = c.head_dim;
    s["shared_row"] = c.shared_row;
    s["format"] = format_name(c.format);
    s["rope"] = {{"style", scenarios::rope_style_name(c.rope.style)},
                 {"rotary_dims", c.rope.rotary_dims},
                 {"base", c.rope.base}};
    s["softmax_scale"] = spec.softmax_scale;
    s["sink_logit"] = c.sink_logit ? Json(*c.sink_logit) : Json(nullptr);
    s["layers"] = c.layers;
    s["max_step_rows"] = spec.max_step_rows;
    const Json answer = exchange(Json{{"op", "open"}, {"spec", s}}, "open");
    Reader r{child(), "open"};
    if (auto refusal = r.status(answer)) {
      *refused = *refusal;
      return nullptr;
    }
    return std::make_unique<ExecCache>(*this, spec);
  }

  /// Sends one request (and after its line `payload`, the bytes of its
  /// frame), returns its parsed answer. The frame the answer announces is
  /// read into `arrays` (read_frame) when the answer is ok; with no arrays,
  /// or a refusal, the answer may carry none.
  Json exchange(const Json& request, const std::string& where, const std::string& payload = {},
                std::vector<FrameArray>* arrays = nullptr) {
    try {
      std::string message = request.dump();
      message += '\n';
      message += payload;
      child().send(message, where);
      const Json answer = Reader{child(), where}.parse(child().receive_header(where));
      const auto ok = answer.find("ok");
      const bool may_carry = arrays != nullptr && ok != answer.end() && ok->is_boolean() && ok->get<bool>();
      std::vector<FrameArray> none;
      read_frame(answer, where, may_carry ? *arrays : none);
      return answer;
    } catch (const CacheCrash&) {
      spent_ = true;  // the next open starts the adapter again
      throw;
    }
  }

  bool binary() const { return encoding_ == ExecEncoding::kBinary; }
  ExecTransport& child() { return *transport_; }

 private:
  /// Reads the frame `answer` announces, if any, into the arrays of `arrays`
  /// it names (none: the answer may carry no frame), and checks that nothing
  /// follows. The header is checked whole (keys, element type, every shape
  /// against what kvcheck asked for, the byte count against the shapes and
  /// the 1 GiB guard) before a byte of the frame is read.
  void read_frame(const Json& answer, const std::string& where, std::vector<FrameArray>& arrays) {
    const auto it = answer.find("frame");
    if (it == answer.end()) {
      child().receive_bytes(0, where);
      return;
    }
    const Reader r{child(), where};
    if (encoding_ != ExecEncoding::kBinary) {
      r.bad(".frame",
            "a binary frame, but this session speaks JSON (frames follow only a hello answer with "
            "\"encoding\": \"binary\", to a hello that offered it: --exec-encoding binary)");
    }
    if (arrays.empty()) {
      r.bad(".frame",
            "a frame on an answer that carries no rows (only an ok answer to prefill, decode or verify does)");
    }
    const Json& f = *it;
    if (!f.is_object()) r.bad(".frame", "expected an object {dtype, bytes, arrays}");
    for (auto k = f.begin(); k != f.end(); ++k) {
      if (k.key() != "dtype" && k.key() != "bytes" && k.key() != "arrays") {
        r.bad(".frame." + k.key(), "unknown key (a frame has dtype, bytes and arrays)");
      }
    }
    const std::string dtype = r.text(f, ".frame", "dtype");
    if (dtype != "f64" && dtype != "f32") {
      r.bad(".frame.dtype", "unknown element type " + Json(dtype).dump() + " (\"f64\" or \"f32\")");
    }
    const std::size_t element_bytes = dtype == "f64" ? 8 : 4;
    const std::int64_t bytes =
        r.integer(r.field(f, ".frame", "bytes"), ".frame.bytes", 0, std::numeric_limits<std::int64_t>::max());
    if (static_cast<std::uint64_t>(bytes) > kExecMaxFrameBytes) {
      r.bad(".frame.bytes", std::to_string(bytes) + " bytes, over the frame limit of 1 GiB");
    }
    const Json& listed = r.field(f, ".frame", "arrays");
    if (!listed.is_array() || listed.empty()) {
      r.bad(".frame.arrays", "expected a non-empty array of [name, rows, width]");
    }
    std::vector<FrameArray*> order;
    std::int64_t shaped_bytes = 0;
    for (std::size_t i = 0; i < listed.size(); ++i) {
      const std::string pa = ".frame.arrays[" + std::to_string(i) + "]";
      const Json& a = listed[i];
      if (!a.is_array() || a.size() != 3 || !a[0].is_string()) r.bad(pa, "expected [name, rows, width]");
      const std::string name = a[0].get<std::string>();
      FrameArray* array = nullptr;
      std::string names;
      for (FrameArray& candidate : arrays) {
        names += (names.empty() ? "\"" : ", \"") + std::string(candidate.name) + "\"";
        if (name == candidate.name) array = &candidate;
      }
      if (array == nullptr) {
        r.bad(pa + "[0]", "unknown array " + Json(name).dump() + " (this answer may carry " + names + ")");
      }
      if (array->present) r.bad(pa + "[0]", Json(name).dump() + " listed twice");
      const std::int64_t rows = r.integer(a[1], pa + "[1]");
      const std::int64_t width = r.integer(a[2], pa + "[2]");
      if (rows != array->rows) {
        r.bad(pa + "[1]", std::to_string(rows) + " rows, expected " + std::to_string(array->rows) +
                              " (one per row the step wrote)");
      }
      if (width != array->width) {
        r.bad(pa + "[2]", "width " + std::to_string(width) + ", expected " + std::to_string(array->width));
      }
      array->present = true;
      order.push_back(array);
      // Both factors are kvcheck's own (a step's rows, a row's width): no overflow.
      shaped_bytes += rows * width * static_cast<std::int64_t>(element_bytes);
    }
    if (shaped_bytes != bytes) {
      r.bad(".frame.bytes", "the header says " + std::to_string(bytes) + " bytes, its arrays' shapes make " +
                                std::to_string(shaped_bytes));
    }
    const std::string payload = child().receive_bytes(static_cast<std::size_t>(bytes), where);
    const char* p = payload.data();
    for (FrameArray* array : order) {
      array->values->clear();
      array->values->reserve(static_cast<std::size_t>(array->rows * array->width));
      for (std::int64_t i = 0; i < array->rows; ++i) {
        for (std::int64_t d = 0; d < array->width; ++d, p += element_bytes) {
          const double x = load_le(p, element_bytes);
          if (!std::isfinite(x)) {
            r.bad("." + std::string(array->name) + "[" + std::to_string(i) + "][" + std::to_string(d) + "]",
                  std::string(std::isnan(x) ? "NaN" : "infinity") + ": a frame carries finite numbers only");
          }
          array->values->push_back(x);
        }
      }
    }
  }

  void hello() {
    encoding_ = ExecEncoding::kJson;  // until this hello's answer says otherwise
    const Json answer = exchange(hello_request(offer_), "hello");
    Reader r{child(), "hello"};
    if (auto refusal = r.status(answer)) {
      child().fail("hello", "the adapter refused the handshake: " + refusal->code + " " + refusal->detail);
    }
    // Strict (engines/exec_hello.hpp): an unknown key or name is an error.
    try {
      caps_ = parse_hello_answer(answer, command_, offer_, &encoding_);
    } catch (const Error& e) {
      child().fail(e.where(), e.rule());
    }
  }

  std::string command_;
  std::unique_ptr<ExecTransport> transport_;
  std::function<std::unique_ptr<ExecTransport>()> restart_;
  bool spent_ = false;  // the adapter crashed; started again at the next open
  ExecEncoding offer_;                           // what hello offers
  ExecEncoding encoding_ = ExecEncoding::kJson;  // what the adapter chose: JSON until it has
  Capabilities caps_;
};

ExecCache::~ExecCache() {
  // Close the case; a broken adapter is reported by the next exchange.
  try {
    provider_.exchange(Json{{"op", "close"}}, "close");
  } catch (...) {
  }
}

StepStatus ExecCache::call(const StepCall& c, StepAnswer* answer) {
  if (answer) answer->clear();
  const std::string op = op_text(c);
  const std::string where =
      (c.step_index >= 0 ? "steps[" + std::to_string(c.step_index) + "]" : std::string("step")) + " (" + op +
      ", layer " + std::to_string(c.layer) + ")";
  Json req{{"op", op}, {"layer", c.layer}, {"request", c.step.request}, {"state", c.state}};
  const auto& cache = spec_.cache;
  const std::int64_t kv_width = static_cast<std::int64_t>(cache.kv_heads) * cache.head_dim;
  const std::int64_t q_width = static_cast<std::int64_t>(cache.q_heads) * cache.head_dim;
  const bool writes = c.op == StepCall::Op::kStep && scenarios::step_kind_writes_rows(c.step.kind);
  if (c.op == StepCall::Op::kStep) {
    switch (scenarios::step_kind_fields(c.step.kind)) {
      case scenarios::StepFields::kRowsOrder:
        req["rows"] = c.rows;
        req["order"] = scenarios::order_name(c.step.order);
        break;
      case scenarios::StepFields::kDrafts: req["drafts"] = c.step.drafts; break;
      case scenarios::StepFields::kAccepted: req["accepted"] = c.step.accepted; break;
      case scenarios::StepFields::kPositions: req["positions"] = c.step.positions; break;
      case scenarios::StepFields::kNone: break;
    }
  }
  const bool prefix = c.op == StepCall::Op::kBegin && c.prefix_positions > 0;
  if (prefix) {
    // A begin from a shared prefix: which request, how many positions, and
    // that request's rows there (JSON in either encoding).
    req["prefix"] = {{"request", c.prefix_request}, {"positions", c.prefix_positions}};
    req["k"] = rows_json(c.k, c.prefix_positions, kv_width);
    if (c.v) req["v"] = rows_json(c.v, c.prefix_positions, kv_width);
  }
  std::string payload;  // a binary request's frame: [rows, kv_width] k, v, then [rows, q_width] q
  if (writes) {
    req["position"] = c.position;
    if (provider_.binary()) {
      Json listed = Json::array();
      const auto frame_rows = [&](const char* name, const double* x, std::int64_t width) {
        listed.push_back(Json::array({name, c.rows, width}));
        append_f64_le(payload, x, static_cast<std::size_t>(c.rows * width));
      };
      frame_rows("k", c.k, kv_width);
      if (c.v) frame_rows("v", c.v, kv_width);
      frame_rows("q", c.q, q_width);
      req["frame"] = {{"dtype", "f64"}, {"bytes", payload.size()}, {"arrays", std::move(listed)}};
    } else {
      req["k"] = rows_json(c.k, c.rows, kv_width);
      if (c.v) req["v"] = rows_json(c.v, c.rows, kv_width);
      req["q"] = rows_json(c.q, c.rows, q_width);
    }
  }
  const Capabilities& caps = provider_.capabilities();
  // What an ok answer's binary frame may carry in place of the JSON fields:
  // the outputs and the stored rows of a step that wrote rows.
  std::vector<double> frame_out, frame_k, frame_v;
  std::vector<FrameArray> arrays;
  if (writes) {
    if (caps.computes_outputs) arrays.push_back({"out", c.rows, q_width, &frame_out});
    arrays.push_back({"stored.k", c.rows, kv_width, &frame_k});
    if (!cache.shared_row) arrays.push_back({"stored.v", c.rows, kv_width, &frame_v});
  }
  const Json j = provider_.exchange(req, where, payload, &arrays);
  Reader r{provider_.child(), where};
  if (auto refusal = r.status(j)) return refusal;
  if (answer == nullptr) return {};
  if (prefix && caps.reports_written_slots && j.contains("written")) {
    // Per prefix position: the slot the cache stored the row sent into, or
    // -1 where it keeps the row the other request has (shared).
    const Json& w = j["written"];
    if (!w.is_array() || static_cast<std::int64_t>(w.size()) != c.prefix_positions) {
      r.bad(".written", "expected " + std::to_string(c.prefix_positions) + " slots, one per prefix position (-1: shared)");
    }
    answer->has_written = true;
    for (std::size_t i = 0; i < w.size(); ++i) {
      answer->written.push_back(r.slot(w[i], ".written[" + std::to_string(i) + "]"));
    }
  }
  // Prefix positions a begin leaves to the request's next writing step, and
  // that step's stored rows (docs/semantics.md "Recompute in a step").
  const auto undeclared = [&](const char* key) {
    if (j.contains(key) && !caps.recompute_in_step)
      r.bad(std::string(".") + key,
            "prefix rows recomputed in a step from a cache that did not declare it (hello "
            "capabilities \"recompute_in_step\": true)");
  };
  undeclared("recompute");
  undeclared("recomputed");
  if (j.contains("recompute")) {
    const Json& list = j["recompute"];
    if (!prefix) r.bad(".recompute", "only a begin from a prefix leaves positions to recompute");
    if (!list.is_array()) r.bad(".recompute", "expected an array of prefix positions");
    std::vector<bool> seen(static_cast<std::size_t>(c.prefix_positions), false);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string pi = ".recompute[" + std::to_string(i) + "]";
      const std::int64_t pos = r.integer(list[i], pi, 0, c.prefix_positions - 1);
      if (seen[static_cast<std::size_t>(pos)]) r.bad(pi, "position " + std::to_string(pos) + " listed twice");
      if (answer->has_written && answer->written[static_cast<std::size_t>(pos)] >= 0)
        r.bad(pi, "position " + std::to_string(pos) + " is also stored at the begin (written[" +
                      std::to_string(pos) + "] is a slot, not -1)");
      seen[static_cast<std::size_t>(pos)] = true;
      answer->recompute.push_back(pos);
    }
  }
  if (j.contains("recomputed")) {
    const Json& list = j["recomputed"];
    if (!writes) r.bad(".recomputed", "only a step that writes rows stores recomputed prefix rows");
    if (!list.is_array()) r.bad(".recomputed", "expected an array of [position, slot] pairs");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string pi = ".recomputed[" + std::to_string(i) + "]";
      if (!list[i].is_array() || list[i].size() != 2) r.bad(pi, "expected [position, slot]");
      answer->recomputed.emplace_back(r.integer(list[i][0], pi + "[0]", 0, c.position - 1),
                                      r.slot(list[i][1], pi + "[1]"));
    }
  }
  // Any ok answer's slot events, a begin's included (a prefix cache evicts at a begin).
  read_slot_events(j, r, caps.reports_cached, answer);
  if (!writes) return {};
  const auto in_frame = [&](const char* name) {
    for (const FrameArray& a : arrays)
      if (a.present && std::strcmp(a.name, name) == 0) return true;
    return false;
  };

  if (!caps.computes_outputs) {
    // A bookkeeping-only engine (hello "outputs": false): no outputs; the
    // runner computes them over the rows its shadow map resolves the reads to.
    if (j.contains("out"))
      r.bad(".out", "the engine declared \"outputs\": false, so its answers carry no out");
    answer->out.assign(static_cast<std::size_t>(c.rows * q_width), 0.0);
  }
  const bool out_in_frame = in_frame("out");
  if (out_in_frame) {
    if (j.contains("out")) r.bad(".out", "given twice: in the JSON and in the frame");
    answer->out = std::move(frame_out);
  }
  const bool out_in_json = caps.computes_outputs && !out_in_frame;
  const Json& out = out_in_json ? r.field(j, "", "out") : j;
  if (out_in_json && (!out.is_array() || static_cast<std::int64_t>(out.size()) != c.rows)) {
    r.bad(".out", "expected " + std::to_string(c.rows) + " output rows");
  }
  if (out_in_json) answer->out.reserve(static_cast<std::size_t>(c.rows * q_width));
  for (std::int64_t i = 0; i < c.rows && out_in_json; ++i) {
    const std::string pi = ".out[" + std::to_string(i) + "]";
    const Json& row = out[static_cast<std::size_t>(i)];
    if (!row.is_array() || static_cast<std::int64_t>(row.size()) != q_width) {
      r.bad(pi, "expected " + std::to_string(q_width) + " numbers (q_heads * head_dim)");
    }
    for (std::int64_t d = 0; d < q_width; ++d) {
      answer->out.push_back(r.number(row[static_cast<std::size_t>(d)], pi + "[" + std::to_string(d) + "]"));
    }
  }
  if (caps.reports_written_slots) {
    const Json& w = r.field(j, "", "written");
    if (!w.is_array() || static_cast<std::int64_t>(w.size()) != c.rows) {
      r.bad(".written", "expected " + std::to_string(c.rows) + " slots, one per row");
    }
    answer->has_written = true;
    for (std::size_t i = 0; i < w.size(); ++i) {
      answer->written.push_back(r.slot(w[i], ".written[" + std::to_string(i) + "]"));
    }
  }
  if (caps.reports_read_slots) {
    const Json& rd = r.field(j, "", "read");
    if (!rd.is_array() || static_cast<std::int64_t>(rd.size()) != c.rows) {
      r.bad(".read", "expected " + std::to_string(c.rows) + " lists of slots, one per query");
    }
    answer->has_reads = true;
    answer->read_offsets.push_back(0);
    for (std::size_t i = 0; i < rd.size(); ++i) {
      const std::string pi = ".read[" + std::to_string(i) + "]";
      if (!rd[i].is_array()) r.bad(pi, "expected an array of slots");
      for (std::size_t s = 0; s < rd[i].size(); ++s) {
        answer->read_slots.push_back(r.slot(rd[i][s], pi + "[" + std::to_string(s) + "]"));
      }
      answer->read_offsets.push_back(static_cast<std::int64_t>(answer->read_slots.size()));
    }
  }
  if (in_frame("stored.k") || in_frame("stored.v")) {
    if (j.contains("stored")) r.bad(".stored", "given twice: in the JSON and in the frame");
    if (!in_frame("stored.k") || (!cache.shared_row && !in_frame("stored.v"))) {
      r.bad(".frame.arrays", cache.shared_row ? "stored rows in a frame: \"stored.k\""
                                              : "stored rows in a frame: \"stored.k\" and \"stored.v\" together");
    }
    answer->stored_k = std::move(frame_k);
    answer->stored_v = std::move(frame_v);
    answer->has_stored = true;
    answer->stored_known.assign(static_cast<std::size_t>(c.rows), 1);
  } else if (j.contains("stored")) {
    // The new rows as stored, decoded (PROTOCOL.md): judged against the
    // reference encoding (README "Stored rows").
    const Json& st = j["stored"];
    if (!st.is_object()) r.bad(".stored", "expected an object with k (and v unless rows are shared)");
    const std::int64_t kv_width = static_cast<std::int64_t>(spec_.cache.kv_heads) * spec_.cache.head_dim;
    auto rows = [&](const char* key, std::vector<double>& into) {
      const std::string pk = std::string(".stored.") + key;
      const Json& m = r.field(st, ".stored", key);
      if (!m.is_array() || static_cast<std::int64_t>(m.size()) != c.rows) {
        r.bad(pk, "expected " + std::to_string(c.rows) + " rows, one per written row");
      }
      for (std::size_t i = 0; i < m.size(); ++i) {
        const std::string pi = pk + "[" + std::to_string(i) + "]";
        if (!m[i].is_array() || static_cast<std::int64_t>(m[i].size()) != kv_width) {
          r.bad(pi, "expected " + std::to_string(kv_width) + " numbers (kv_heads * head_dim)");
        }
        for (std::size_t e = 0; e < m[i].size(); ++e) {
          into.push_back(r.number(m[i][e], pi + "[" + std::to_string(e) + "]"));
        }
      }
    };
    rows("k", answer->stored_k);
    if (!spec_.cache.shared_row) rows("v", answer->stored_v);
    answer->has_stored = true;
    answer->stored_known.assign(static_cast<std::size_t>(c.rows), 1);
  }
  if (j.contains("read_view")) {
    const std::string view = r.text(j, "", "read_view");
    if (view == "causal") {
      answer->view = ReadView::kCausal;
    } else if (view != "after_writes") {
      r.bad(".read_view", "expected \"after_writes\" or \"causal\", got \"" + view + "\"");
    }
  }
  return {};
}

}  // namespace

std::unique_ptr<CacheProvider> make_exec_provider(const std::string& command, const ExecOptions& options) {
  if (command.empty())
    throw Error(ErrorId::kUsage, "--impl",
                "exec: needs a command, e.g. exec:'python3 adapters/ring_cache.py'");
  const double timeout = options.step_timeout_seconds;
  return std::make_unique<ExecProvider>(command, start_exec_child(command, timeout),
                                        [command, timeout] { return start_exec_child(command, timeout); },
                                        options.encoding);
}

std::unique_ptr<CacheProvider> make_exec_provider(std::unique_ptr<ExecTransport> transport, const std::string& name,
                                                  ExecEncoding offer) {
  return std::make_unique<ExecProvider>(name, std::move(transport), nullptr, offer);
}

}  // namespace kvcheck::engines
