#include "engines/exec_cache.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

extern char** environ;

namespace kvcheck::engines {

namespace {

using Json = nlohmann::json;
using scenarios::StepKind;

constexpr std::size_t kStderrTailBytes = 2048;
constexpr std::size_t kMaxLineBytes = std::size_t{1} << 30;

/// The child process and its three pipes.
class Child {
 public:
  Child(const std::string& command, double timeout_seconds) : command_(command), timeout_(timeout_seconds) {
    // A write to a dead adapter must come back as EPIPE, not kill kvcheck.
    ::signal(SIGPIPE, SIG_IGN);
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      throw Error(ErrorId::kAdapter, "--impl", std::string("cannot create pipes: ") + std::strerror(errno));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group, so the whole tree (sh and the adapter) can be killed.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    const int rc = ::posix_spawn(&pid_, "/bin/sh", &actions, &attr, const_cast<char* const*>(argv), environ);
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
    ::fcntl(from_child_, F_SETFL, ::fcntl(from_child_, F_GETFL) | O_NONBLOCK);
    ::fcntl(err_child_, F_SETFL, ::fcntl(err_child_, F_GETFL) | O_NONBLOCK);
  }

  ~Child() { stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  /// Closes stdin (the adapter's cue to exit), waits briefly, then kills the
  /// process group and reaps the child.
  void stop() noexcept {
    if (pid_ <= 0) {
      close_all();
      return;
    }
    if (to_child_ >= 0) {
      ::close(to_child_);
      to_child_ = -1;
    }
    int status = 0;
    bool reaped = false;
    for (int i = 0; i < 50 && !reaped; ++i) {
      reaped = ::waitpid(pid_, &status, WNOHANG) == pid_;
      if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(-pid_, SIGKILL);
    if (!reaped) ::waitpid(pid_, &status, 0);
    pid_ = -1;
    close_all();
  }

  /// Sends one line; throws when the adapter is gone.
  void send(const std::string& line, const std::string& where) {
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(to_child_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        fail(where, "cannot write to the adapter (" + std::string(std::strerror(errno)) + ")" + exit_text());
      done += static_cast<std::size_t>(n);
    }
  }

  /// Receives one line within the timeout; throws on EOF, timeout or overlong lines.
  std::string receive(const std::string& where) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
    for (;;) {
      if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      if (buffer_.size() > kMaxLineBytes) fail(where, "an answer line longer than 1 GiB");
      const auto left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) {
        fail(where, "no answer within " + format_seconds(timeout_) + " s (--step-timeout)");
      }
      pollfd fds[2] = {{from_child_, POLLIN, 0}, {err_child_, POLLIN, 0}};
      const int nfds = err_child_ >= 0 ? 2 : 1;
      const int rc = ::poll(fds, static_cast<nfds_t>(nfds), static_cast<int>(std::ceil(left * 1000)));
      if (rc < 0 && errno == EINTR) continue;
      if (nfds == 2 && (fds[1].revents & (POLLIN | POLLHUP))) drain_stderr();
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        char chunk[65536];
        const ssize_t n = ::read(from_child_, chunk, sizeof chunk);
        if (n > 0) {
          buffer_.append(chunk, static_cast<std::size_t>(n));
        } else if (n == 0) {
          drain_stderr();
          fail(where, "the adapter closed its stdout" + exit_text());
        }
      }
    }
  }

  [[noreturn]] void fail(const std::string& where, const std::string& what) {
    drain_stderr();
    std::string message = what;
    if (!stderr_tail_.empty()) {
      std::string tail = stderr_tail_;
      while (!tail.empty() && tail.back() == '\n') tail.pop_back();
      message += "\n--- last lines of the adapter's stderr ---\n" + tail;
    }
    stop();
    throw Error(ErrorId::kAdapter, where, message);
  }

 private:
  static std::string format_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
  }

  /// ", exit status N" / ", killed by signal N" once the child has ended.
  std::string exit_text() {
    if (pid_ <= 0) return "";
    int status = 0;
    pid_t r = 0;
    for (int i = 0; i < 20 && r == 0; ++i) {
      r = ::waitpid(pid_, &status, WNOHANG);
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (r != pid_) return "";
    pid_ = -1;
    if (WIFEXITED(status)) return " (adapter exited with status " + std::to_string(WEXITSTATUS(status)) + ")";
    if (WIFSIGNALED(status)) return " (adapter killed by signal " + std::to_string(WTERMSIG(status)) + ")";
    return "";
  }

  void drain_stderr() {
    if (err_child_ < 0) return;
    char chunk[4096];
    for (;;) {
      const ssize_t n = ::read(err_child_, chunk, sizeof chunk);
      if (n <= 0) {
        if (n == 0) {
          ::close(err_child_);
          err_child_ = -1;
        }
        return;
      }
      stderr_tail_.append(chunk, static_cast<std::size_t>(n));
      if (stderr_tail_.size() > kStderrTailBytes)
        stderr_tail_.erase(0, stderr_tail_.size() - kStderrTailBytes);
    }
  }

  void close_all() noexcept {
    for (int* fd : {&to_child_, &from_child_, &err_child_}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }

  std::string command_;
  double timeout_;
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1, err_child_ = -1;
  std::string buffer_;
  std::string stderr_tail_;
};

// ---- reading answers: every check names the JSON path -----------------------

struct Reader {
  Child& child;
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
    return v.get<std::int64_t>();
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
  ExecProvider(const std::string& command, const ExecOptions& options)
      : command_(command), child_(command, options.step_timeout_seconds) {
    hello();
  }

  const Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return "exec:" + command_; }

  std::unique_ptr<CacheUnderTest> open(const CacheSpec& spec, Refusal* refused) override {
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
    s["format"] = scenarios::format_name(c.format);
    s["rope"] = {{"style", scenarios::rope_style_name(c.rope.style)},
                 {"rotary_dims", c.rope.rotary_dims},
                 {"base", c.rope.base}};
    s["softmax_scale"] = spec.softmax_scale;
    s["sink_logit"] = c.sink_logit ? Json(*c.sink_logit) : Json(nullptr);
    s["layers"] = c.layers;
    s["max_step_rows"] = spec.max_step_rows;
    const Json answer = exchange(Json{{"op", "open"}, {"spec", s}}, "open");
    Reader r{child_, "open"};
    if (auto refusal = r.status(answer)) {
      *refused = *refusal;
      return nullptr;
    }
    return std::make_unique<ExecCache>(*this, spec);
  }

  /// Sends one request, returns its parsed answer.
  Json exchange(const Json& request, const std::string& where) {
    child_.send(request.dump() + "\n", where);
    return Reader{child_, where}.parse(child_.receive(where));
  }

  Child& child() { return child_; }

 private:
  void hello() {
    const Json answer = exchange(
        Json{{"op", "hello"}, {"protocol", "kvcheck-exec"}, {"version", kExecProtocolVersion}}, "hello");
    Reader r{child_, "hello"};
    if (auto refusal = r.status(answer)) {
      child_.fail("hello", "the adapter refused the handshake: " + refusal->code + " " + refusal->detail);
    }
    const std::int64_t version = r.integer(r.field(answer, "", "version"), ".version");
    if (version != kExecProtocolVersion) {
      r.bad(".version", "protocol version " + std::to_string(version) + ", kvcheck speaks " +
                            std::to_string(kExecProtocolVersion));
    }
    caps_.name = "exec:" + (answer.contains("name") ? r.text(answer, "", "name") : command_);
    const Json& caps = r.field(answer, "", "capabilities");
    if (!caps.is_object()) r.bad(".capabilities", "expected an object");
    read_capabilities(r, caps);
  }

  void read_capabilities(const Reader& r, const Json& caps) {
    const std::string p = ".capabilities";
    auto strings = [&](const char* key) {
      std::vector<std::string> out;
      const Json& v = r.field(caps, p, key);
      if (!v.is_array()) r.bad(p + "." + key, "expected an array of strings");
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string()) r.bad(p + "." + key + "[" + std::to_string(i) + "]", "expected a string");
        out.push_back(v[i].get<std::string>());
      }
      return out;
    };
    auto has = [](const std::vector<std::string>& v, const char* x) {
      return std::find(v.begin(), v.end(), x) != v.end();
    };
    const auto steps = strings("steps");
    caps_.prefill_load_then_store = has(steps, "prefill_load_then_store");
    caps_.prefill_store_then_load = has(steps, "prefill_store_then_load");
    caps_.decode = has(steps, "decode");
    caps_.verify = has(steps, "verify") && has(steps, "accept");
    caps_.finish = has(steps, "finish");
    caps_.reset = has(steps, "reset");
    caps_.formats.clear();
    for (const auto& f : strings("formats")) {
      if (f == "f64") caps_.formats.push_back(scenarios::Format::kF64);
      if (f == "f32") caps_.formats.push_back(scenarios::Format::kF32);
      if (f == "bf16") caps_.formats.push_back(scenarios::Format::kBf16);
      if (f == "fp8") caps_.formats.push_back(scenarios::Format::kFp8);
    }
    caps_.rope_styles.clear();
    for (const auto& s : strings("rope")) {
      if (s == "none") caps_.rope_styles.push_back(scenarios::RopeStyle::kNone);
      if (s == "neox") caps_.rope_styles.push_back(scenarios::RopeStyle::kNeox);
      if (s == "interleaved") caps_.rope_styles.push_back(scenarios::RopeStyle::kInterleaved);
    }
    if (caps_.rope_styles.empty()) caps_.rope_styles.push_back(scenarios::RopeStyle::kNone);
    const auto layouts = strings("layouts");
    caps_.gqa = has(layouts, "gqa") && has(layouts, "mqa");
    caps_.shared_row = has(layouts, "shared");
    auto flag = [&](const char* key, bool fallback) {
      return caps.contains(key) ? r.boolean(caps, p, key) : fallback;
    };
    auto limit = [&](const char* key) {
      if (!caps.contains(key)) return std::int64_t{0};
      const std::int64_t v = r.integer(caps[key], p + "." + key);
      if (v < 0) r.bad(p + "." + key, "must be >= 0");
      return v;
    };
    caps_.sink = flag("sink", false);
    caps_.softmax_scale = flag("softmax_scale", false);
    caps_.partial_rope = flag("partial_rope", true);
    caps_.max_states = limit("max_states");
    caps_.max_layers = limit("max_layers");
    caps_.max_step_rows = limit("max_step_rows");
    caps_.max_head_dim = limit("max_head_dim");
    caps_.max_heads = limit("max_heads");
    if (caps.contains("reports")) {
      const Json& rep = caps["reports"];
      if (!rep.is_object()) r.bad(p + ".reports", "expected an object");
      caps_.reports_written_slots =
          rep.contains("written_slots") && r.boolean(rep, p + ".reports", "written_slots");
      caps_.reports_read_slots = rep.contains("read_slots") && r.boolean(rep, p + ".reports", "read_slots");
    } else {
      caps_.reports_written_slots = caps_.reports_read_slots = false;
    }
    caps_.ring_addressing = caps.contains("addressing") && r.text(caps, p, "addressing") == "ring";
    if (caps.contains("probes")) caps_.probes = strings("probes");
  }

  std::string command_;
  Child child_;
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
  const bool writes =
      c.op == StepCall::Op::kStep && (c.step.kind == StepKind::kPrefill || c.step.kind == StepKind::kDecode ||
                                      c.step.kind == StepKind::kVerify);
  if (c.op == StepCall::Op::kStep) {
    switch (c.step.kind) {
      case StepKind::kPrefill:
        req["rows"] = c.rows;
        req["order"] = scenarios::order_name(c.step.order);
        break;
      case StepKind::kVerify: req["drafts"] = c.step.drafts; break;
      case StepKind::kAccept: req["accepted"] = c.step.accepted; break;
      default: break;
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

  const Json& out = r.field(j, "", "out");
  if (!out.is_array() || static_cast<std::int64_t>(out.size()) != c.rows) {
    r.bad(".out", "expected " + std::to_string(c.rows) + " output rows");
  }
  answer->out.reserve(static_cast<std::size_t>(c.rows * q_width));
  for (std::int64_t i = 0; i < c.rows; ++i) {
    const std::string pi = ".out[" + std::to_string(i) + "]";
    const Json& row = out[static_cast<std::size_t>(i)];
    if (!row.is_array() || static_cast<std::int64_t>(row.size()) != q_width) {
      r.bad(pi, "expected " + std::to_string(q_width) + " numbers (q_heads * head_dim)");
    }
    for (std::int64_t d = 0; d < q_width; ++d) {
      answer->out.push_back(r.number(row[static_cast<std::size_t>(d)], pi + "[" + std::to_string(d) + "]"));
    }
  }
  const Capabilities& caps = provider_.capabilities();
  if (caps.reports_written_slots) {
    const Json& w = r.field(j, "", "written");
    if (!w.is_array() || static_cast<std::int64_t>(w.size()) != c.rows) {
      r.bad(".written", "expected " + std::to_string(c.rows) + " slots, one per row");
    }
    answer->has_written = true;
    for (std::size_t i = 0; i < w.size(); ++i) {
      answer->written.push_back(r.integer(w[i], ".written[" + std::to_string(i) + "]"));
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
        answer->read_slots.push_back(r.integer(rd[i][s], pi + "[" + std::to_string(s) + "]"));
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
  return std::make_unique<ExecProvider>(command, options);
}

}  // namespace kvcheck::engines
