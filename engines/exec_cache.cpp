#include "engines/exec_cache.hpp"

#include <cerrno>
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

  /// A slot id: 0 .. 2^63 - 1 (`lowest` -1 for a read: an ignored entry),
  /// as `kvcheck audit` reads them in traces.
  std::int64_t slot(const Json& v, const std::string& path, std::int64_t lowest) const {
    const std::int64_t x = integer(v, path);
    if (x < lowest) {
      bad(path, "slot " + std::to_string(x) + " is outside the protocol's slot ids (" +
                    std::to_string(lowest) + " .. 2^63 - 1" + (lowest < 0 ? ", -1: ignored" : "") + ")");
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
  ExecProvider(const std::string& command, std::unique_ptr<ExecTransport> transport,
               std::function<std::unique_ptr<ExecTransport>()> restart = {})
      : command_(command), transport_(std::move(transport)), restart_(std::move(restart)) {
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
    s["window"] = {{"param", c.window},
                   {"convention", scenarios::convention_name(c.convention)},
                   {"keys", spec.window_keys}};
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

  /// Sends one request, returns its parsed answer.
  Json exchange(const Json& request, const std::string& where) {
    try {
      child().send(request.dump() + "\n", where);
      return Reader{child(), where}.parse(child().receive(where));
    } catch (const CacheCrash&) {
      spent_ = true;  // the next open starts the adapter again
      throw;
    }
  }

  ExecTransport& child() { return *transport_; }

 private:
  void hello() {
    const Json answer = exchange(
        Json{{"op", "hello"}, {"protocol", kExecProtocolName}, {"version", kExecProtocolVersion}}, "hello");
    Reader r{child(), "hello"};
    if (auto refusal = r.status(answer)) {
      child().fail("hello", "the adapter refused the handshake: " + refusal->code + " " + refusal->detail);
    }
    // Strict (engines/exec_hello.hpp): an unknown key or name is an error.
    try {
      caps_ = parse_hello_answer(answer, command_);
    } catch (const Error& e) {
      child().fail(e.where(), e.rule());
    }
  }

  std::string command_;
  std::unique_ptr<ExecTransport> transport_;
  std::function<std::unique_ptr<ExecTransport>()> restart_;
  bool spent_ = false;  // the adapter crashed; started again at the next open
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
      case scenarios::StepFields::kNone: break;
    }
  }
  if (writes) {
    req["position"] = c.position;
    req["k"] = rows_json(c.k, c.rows, kv_width);
    if (c.v) req["v"] = rows_json(c.v, c.rows, kv_width);
    req["q"] = rows_json(c.q, c.rows, q_width);
  }
  const Json j = provider_.exchange(req, where);
  Reader r{provider_.child(), where};
  if (auto refusal = r.status(j)) return refusal;
  if (!writes || answer == nullptr) return {};

  const Capabilities& caps = provider_.capabilities();
  if (!caps.computes_outputs) {
    // A bookkeeping-only engine (hello "outputs": false): no outputs; the
    // runner computes them over the rows its shadow map resolves the reads to.
    if (j.contains("out"))
      r.bad(".out", "the engine declared \"outputs\": false, so its answers carry no out");
    answer->out.assign(static_cast<std::size_t>(c.rows * q_width), 0.0);
  }
  const Json& out = caps.computes_outputs ? r.field(j, "", "out") : j;
  if (caps.computes_outputs && (!out.is_array() || static_cast<std::int64_t>(out.size()) != c.rows)) {
    r.bad(".out", "expected " + std::to_string(c.rows) + " output rows");
  }
  if (caps.computes_outputs) answer->out.reserve(static_cast<std::size_t>(c.rows * q_width));
  for (std::int64_t i = 0; i < c.rows && caps.computes_outputs; ++i) {
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
      answer->written.push_back(r.slot(w[i], ".written[" + std::to_string(i) + "]", 0));
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
        answer->read_slots.push_back(r.slot(rd[i][s], pi + "[" + std::to_string(s) + "]", -1));
      }
      answer->read_offsets.push_back(static_cast<std::int64_t>(answer->read_slots.size()));
    }
  }
  if (j.contains("stored")) {
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
                                        [command, timeout] { return start_exec_child(command, timeout); });
}

std::unique_ptr<CacheProvider> make_exec_provider(std::unique_ptr<ExecTransport> transport, const std::string& name) {
  return std::make_unique<ExecProvider>(name, std::move(transport));
}

}  // namespace kvcheck::engines
