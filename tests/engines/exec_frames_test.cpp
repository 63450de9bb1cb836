// Binary frames of the exec protocol (adapters/PROTOCOL.md "Binary frames"):
// negotiated at hello, JSON unless offered and chosen, and read as strictly
// as JSON: a frame header is checked whole (keys, element type, every shape,
// the byte count, the 1 GiB guard) before a byte of it is read, a value that
// is not finite is an error naming its JSON path, and a frame the session did
// not negotiate is refused. The adapter is scripted in memory, except two
// /bin/sh adapters that end or stall inside a frame (the real transport).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "engines/exec_cache.hpp"
#include "engines/exec_hello.hpp"
#include "engines/exec_transport.hpp"
#include "support/error.hpp"

namespace {

using Json = nlohmann::json;
namespace en = kvcheck::engines;

/// An adapter in memory: request i gets scripted answer i (a line and any
/// bytes after it); every request kvcheck sends is kept.
class FrameScript final : public en::ExecTransport {
 public:
  FrameScript(std::vector<std::string> answers, std::vector<std::string>* sent, std::size_t* largest_read)
      : answers_(std::move(answers)), sent_(sent), largest_read_(largest_read) {}
  void send(std::string_view message, const std::string& where) override {
    if (!rest_.empty()) fail(where, "an unrequested line");
    sent_->emplace_back(message);
    if (next_ == answers_.size()) fail(where, "the adapter closed its stdout");
    rest_ = answers_[next_++];
  }
  std::string receive(const std::string& where) override {
    std::string line = receive_header(where);
    if (!rest_.empty()) fail(where, "an unrequested line");
    return line;
  }
  std::string receive_header(const std::string& where) override {
    const auto nl = rest_.find('\n');
    if (nl == std::string::npos) fail(where, "the adapter closed its stdout");
    std::string line = rest_.substr(0, nl);
    rest_.erase(0, nl + 1);
    return line;
  }
  std::string receive_bytes(std::size_t bytes, const std::string& where) override {
    *largest_read_ = std::max(*largest_read_, bytes);
    if (rest_.size() < bytes) fail(where, "the adapter closed its stdout inside the frame");
    std::string payload = rest_.substr(0, bytes);
    rest_.erase(0, bytes);
    if (!rest_.empty()) fail(where, "an unrequested line");
    return payload;
  }

 protected:
  std::string on_failure(const std::string& what) override { return what; }

 private:
  std::vector<std::string> answers_;
  std::size_t next_ = 0;
  std::string rest_;
  std::vector<std::string>* sent_;
  std::size_t* largest_read_;
};

/// A hello answer; `encoding` "" for none.
std::string hello_answer(const std::string& encoding, bool reports = true) {
  Json h = Json::parse(R"({"ok":true,"protocol":"kvcheck-exec","version":1,"name":"frames",
    "capabilities":{"steps":["prefill_store_then_load","decode","finish"],"formats":["f32"],"rope":["neox"],
                    "layouts":["mqa","gqa"]}})");
  if (reports) h["capabilities"]["reports"] = {{"written_slots", true}, {"read_slots", true}};
  if (!encoding.empty()) h["encoding"] = encoding;
  return h.dump() + "\n";
}

/// Little-endian bytes of `values` as f64 (8 bytes each) or f32 (4).
std::string le_bytes(const std::vector<double>& values, std::size_t element_bytes) {
  std::string out;
  for (const double x : values) {
    std::uint64_t bits = 0;
    if (element_bytes == 8) {
      std::memcpy(&bits, &x, 8);
    } else {
      const float f = static_cast<float>(x);
      std::uint32_t b32 = 0;
      std::memcpy(&b32, &f, 4);
      bits = b32;
    }
    for (std::size_t b = 0; b < element_bytes; ++b) out.push_back(static_cast<char>(bits >> (8 * b)));
  }
  return out;
}

/// The case every test opens: 3 rows of k, v [3, 4] and q [3, 8].
constexpr std::int64_t kRows = 3, kKvWidth = 4, kQWidth = 8;

en::CacheSpec frame_spec() {
  en::CacheSpec spec;
  spec.cache.window = 4;
  spec.cache.ring_rows = 8;
  spec.cache.states = 2;
  spec.cache.q_heads = 2;
  spec.cache.kv_heads = 1;
  spec.cache.head_dim = 4;
  spec.cache.format = kvcheck::scenarios::Format::kF32;
  spec.cache.rope = {kvcheck::scenarios::RopeStyle::kNeox, 4, 10000.0};
  spec.window_keys = 4;
  spec.max_step_rows = 3;
  spec.softmax_scale = 0.5;
  return spec;
}

/// Numbers [n] distinct per array, exactly representable in f32.
std::vector<double> numbers(std::int64_t n, double base) {
  std::vector<double> x(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = base + 0.125 * static_cast<double>(i) - 1.0;
  return x;
}

/// A step answer: `header` (ok, written, read, ...) with a frame of `arrays`
/// ({name, rows, width}, the values numbers(rows * width, i)) in `dtype`.
struct FrameArg {
  std::string name;
  std::int64_t rows, width;
};
std::string frame_answer(Json header, const std::vector<FrameArg>& arrays, const std::string& dtype = "f64") {
  const std::size_t element_bytes = dtype == "f32" ? 4 : 8;
  std::string payload;
  Json listed = Json::array();
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    listed.push_back(Json::array({arrays[i].name, arrays[i].rows, arrays[i].width}));
    payload += le_bytes(numbers(arrays[i].rows * arrays[i].width, static_cast<double>(i)), element_bytes);
  }
  header["frame"] = {{"dtype", dtype}, {"bytes", payload.size()}, {"arrays", listed}};
  return header.dump() + "\n" + payload;
}

Json ok_slots() {
  return {{"ok", true}, {"written", {0, 1, 2}}, {"read", {{0}, {0, 1}, {0, 1, 2}}}};
}

/// An ok JSON answer with outputs of 0.5.
std::string json_answer() {
  Json j = ok_slots();
  j["out"] = Json::array();
  for (int i = 0; i < kRows; ++i) j["out"].push_back(std::vector<double>(kQWidth, 0.5));
  return j.dump() + "\n";
}

/// Runs hello, open, begin and a prefill of kRows rows whose answer is
/// `prefill_answer`; returns the answer, the requests sent and the largest
/// frame read. Throws what the provider throws.
struct Session {
  en::StepAnswer answer;
  std::vector<std::string> sent;
  std::size_t largest_read = 0;
};
void run_prefill_into(Session& s, const std::string& hello, const std::string& prefill_answer,
                      en::ExecEncoding offer, std::int64_t position = 0) {
  auto script = std::make_unique<FrameScript>(
      std::vector<std::string>{hello, "{\"ok\":true}\n", "{\"ok\":true}\n", prefill_answer, "{\"ok\":true}\n"},
      &s.sent, &s.largest_read);
  auto provider = en::make_exec_provider(std::move(script), "frames", offer);
  en::Refusal refused;
  auto cache = provider->open(frame_spec(), &refused);
  REQUIRE(cache);
  const std::vector<double> k = numbers(kRows * kKvWidth, 10), v = numbers(kRows * kKvWidth, 20),
                            q = numbers(kRows * kQWidth, 30);
  en::StepCall call;
  call.op = en::StepCall::Op::kBegin;
  call.state = 1;
  call.step_index = 0;
  REQUIRE_FALSE(cache->call(call, nullptr));
  call.op = en::StepCall::Op::kStep;
  call.step.kind = kvcheck::scenarios::StepKind::kPrefill;
  call.step.rows = kRows;
  call.step.order = kvcheck::scenarios::Order::kStoreThenLoad;
  call.rows = kRows;
  call.position = position;
  call.step_index = 1;
  call.k = k.data();
  call.v = v.data();
  call.q = q.data();
  const en::StepStatus status = cache->call(call, &s.answer);  // throws past Catch for a bad answer
  REQUIRE_FALSE(status);
}

Session run_prefill(const std::string& hello, const std::string& prefill_answer,
                    en::ExecEncoding offer = en::ExecEncoding::kBinary) {
  Session s;
  run_prefill_into(s, hello, prefill_answer, offer);
  return s;
}

/// "WHERE: RULE" of the error a prefill answer gives, "" when it is read.
std::string frame_error(const std::string& hello, const std::string& prefill_answer,
                        std::size_t* largest_read = nullptr) {
  Session s;
  std::string error;
  try {
    run_prefill_into(s, hello, prefill_answer, en::ExecEncoding::kBinary);
  } catch (const kvcheck::Error& e) {
    CHECK(e.id() == kvcheck::ErrorId::kAdapter);
    error = e.where() + ": " + e.rule();
  }
  if (largest_read) *largest_read = s.largest_read;
  return error;
}

/// The values of the f64 array at `at` in `payload`.
std::vector<double> f64_at(const std::string& payload, std::size_t at, std::size_t count) {
  std::vector<double> x(count);
  REQUIRE(payload.size() >= at + count * 8);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t bits = 0;
    for (int b = 7; b >= 0; --b) bits = bits << 8 | static_cast<unsigned char>(payload[at + i * 8 + b]);
    std::memcpy(&x[i], &bits, 8);
  }
  return x;
}

}  // namespace

TEST_CASE("ExecFrames: without an offer hello is the version-1 line, and an encoding nobody offered is an error") {
  CHECK(en::hello_request(en::ExecEncoding::kJson).dump() == R"({"op":"hello","protocol":"kvcheck-exec","version":1})");
  CHECK(en::hello_request(en::ExecEncoding::kBinary)["encodings"] == Json::array({"binary", "json"}));
  const Session json = run_prefill(hello_answer(""), json_answer(), en::ExecEncoding::kJson);
  CHECK(json.sent[0] == "{\"op\":\"hello\",\"protocol\":\"kvcheck-exec\",\"version\":1}\n");
  CHECK(json.sent[3].find("\"k\":[[") != std::string::npos);
  CHECK(json.sent[3].find("frame") == std::string::npos);
  try {
    run_prefill(hello_answer("binary"), json_answer(), en::ExecEncoding::kJson);
    FAIL("an encoding kvcheck did not offer was accepted");
  } catch (const kvcheck::Error& e) {
    CHECK(e.where() == "hello answer.encoding");
    CHECK_THAT(e.rule(), Catch::Contains("kvcheck offered no encodings"));
  }
  try {
    run_prefill(hello_answer("f16"), json_answer());
    FAIL("an unknown encoding was accepted");
  } catch (const kvcheck::Error& e) {
    CHECK(e.where() == "hello answer.encoding");
    CHECK_THAT(e.rule(), Catch::Contains("unknown encoding \"f16\""));
  }
  // Offered and declined (or not answered): JSON rows.
  for (const std::string declined : {"json", ""}) {
    const Session s = run_prefill(hello_answer(declined), json_answer());
    CHECK(s.sent[0].find("\"encodings\":[\"binary\",\"json\"]") != std::string::npos);
    CHECK(s.sent[3].find("\"k\":[[") != std::string::npos);
  }
}

TEST_CASE("ExecFrames: rows go out as one f64 frame and outputs and stored rows come back in one") {
  Json header = ok_slots();
  const Session s = run_prefill(
      hello_answer("binary"),
      frame_answer(header, {{"out", kRows, kQWidth}, {"stored.k", kRows, kKvWidth}, {"stored.v", kRows, kKvWidth}}));
  // The request: a header line without k, v, q, then exactly its frame.
  const std::string& prefill = s.sent[3];
  const auto nl = prefill.find('\n');
  const Json sent = Json::parse(prefill.substr(0, nl));
  CHECK_FALSE(sent.contains("k"));
  CHECK_FALSE(sent.contains("q"));
  CHECK(sent["frame"] == Json::parse(R"({"dtype":"f64","bytes":384,"arrays":[["k",3,4],["v",3,4],["q",3,8]]})"));
  const std::string payload = prefill.substr(nl + 1);
  CHECK(payload.size() == 384);
  CHECK(f64_at(payload, 0, 12) == numbers(12, 10));
  CHECK(f64_at(payload, 96, 12) == numbers(12, 20));
  CHECK(f64_at(payload, 192, 24) == numbers(24, 30));
  // The answer: outputs and stored rows from the frame, slots from the JSON.
  CHECK(s.answer.out == numbers(kRows * kQWidth, 0));
  CHECK(s.answer.has_stored);
  CHECK(s.answer.stored_k == numbers(kRows * kKvWidth, 1));
  CHECK(s.answer.stored_v == numbers(kRows * kKvWidth, 2));
  CHECK(s.answer.written == std::vector<std::int64_t>{0, 1, 2});
  CHECK(s.largest_read == 384);
  // f32 elements read exactly; begin and finish answers stay JSON lines.
  const Session f32 = run_prefill(hello_answer("binary"), frame_answer(header, {{"out", kRows, kQWidth}}, "f32"));
  CHECK(f32.answer.out == numbers(kRows * kQWidth, 0));
  CHECK_FALSE(f32.answer.has_stored);
  CHECK(f32.sent[2].find("frame") == std::string::npos);
  // Outputs may also stay JSON in a binary session.
  CHECK(run_prefill(hello_answer("binary"), json_answer()).answer.out == std::vector<double>(24, 0.5));
}

TEST_CASE("ExecFrames: a frame that disagrees with its header or the step is an error naming the field") {
  const std::string hello = hello_answer("binary");
  const Json h = ok_slots();
  const std::string at = "steps[1] (prefill, layer 0) answer";
  auto with_frame = [&](const Json& frame, const std::string& payload) {
    Json j = h;
    j["frame"] = frame;
    return j.dump() + "\n" + payload;
  };
  const std::string out_bytes = le_bytes(numbers(24, 0), 8);
  struct Twist {
    std::string answer;
    std::string expected;
  };
  const Twist twists[] = {
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":184,"arrays":[["out",3,8]]})"), out_bytes.substr(0, 184)),
       at + ".frame.bytes: the header says 184 bytes, its arrays' shapes make 192"},
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":128,"arrays":[["out",2,8]]})"), out_bytes.substr(0, 128)),
       at + ".frame.arrays[0][1]: 2 rows, expected 3"},
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":216,"arrays":[["out",3,9]]})"), out_bytes + "12345678" +
                                                                                            std::string(16, '\0')),
       at + ".frame.arrays[0][2]: width 9, expected 8"},
      {with_frame(Json::parse(R"({"dtype":"f16","bytes":96,"arrays":[["out",3,8]]})"), out_bytes.substr(0, 96)),
       at + ".frame.dtype: unknown element type \"f16\""},
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":192,"arrays":[["outs",3,8]]})"), out_bytes),
       at + ".frame.arrays[0][0]: unknown array \"outs\" (this answer may carry \"out\", \"stored.k\", \"stored.v\")"},
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":384,"arrays":[["out",3,8],["out",3,8]]})"),
                  out_bytes + out_bytes),
       at + ".frame.arrays[1][0]: \"out\" listed twice"},
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":192,"arrays":[["out",3,8]],"crc":0})"), out_bytes),
       at + ".frame.crc: unknown key"},
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":-8,"arrays":[["out",3,8]]})"), ""),
       at + ".frame.bytes: out of range: -8"},
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":288,"arrays":[["out",3,8],["stored.k",3,4]]})"),
                  out_bytes + le_bytes(numbers(12, 0), 8)),
       at + ".frame.arrays: stored rows in a frame: \"stored.k\" and \"stored.v\" together"},
      {with_frame(Json::parse(R"({"dtype":"f64","bytes":0,"arrays":[]})"), ""),
       at + ".frame.arrays: expected a non-empty array"},
  };
  for (const Twist& t : twists) {
    INFO(t.expected);
    CHECK_THAT(frame_error(hello, t.answer), Catch::StartsWith(t.expected));
  }
  // Given twice: in the JSON and in the frame.
  Json both = h;
  both["out"] = Json::array();
  CHECK_THAT(frame_error(hello, frame_answer(both, {{"out", kRows, kQWidth}})),
             Catch::StartsWith(at + ".out: given twice"));
}

TEST_CASE("ExecFrames: NaN and infinity in a frame are errors at the value's JSON path") {
  const std::string hello = hello_answer("binary");
  std::vector<double> out = numbers(24, 0);
  out[1 * kQWidth + 3] = std::numeric_limits<double>::quiet_NaN();
  Json h = ok_slots();
  h["frame"] = Json::parse(R"({"dtype":"f64","bytes":192,"arrays":[["out",3,8]]})");
  CHECK(frame_error(hello, h.dump() + "\n" + le_bytes(out, 8)) ==
        "steps[1] (prefill, layer 0) answer.out[1][3]: NaN: a frame carries finite numbers only");
  std::vector<double> stored = numbers(12, 0);
  stored[2] = -std::numeric_limits<double>::infinity();
  h["frame"] = Json::parse(R"({"dtype":"f32","bytes":192,"arrays":[["out",3,8],["stored.k",3,4],["stored.v",3,4]]})");
  CHECK(frame_error(hello, h.dump() + "\n" + le_bytes(numbers(24, 0), 4) + le_bytes(stored, 4) +
                               le_bytes(numbers(12, 0), 4)) ==
        "steps[1] (prefill, layer 0) answer.stored.k[0][2]: infinity: a frame carries finite numbers only");
}

TEST_CASE("ExecFrames: a forged length is refused before a byte of the frame is read or kept") {
  const std::string hello = hello_answer("binary");
  for (const std::string bytes : {"2147483648", "1073741825", "9223372036854775807"}) {
    Json h = ok_slots();
    h["frame"] = Json::parse(R"({"dtype":"f64","arrays":[["out",3,8]]})");
    h["frame"]["bytes"] = Json::parse(bytes);
    std::size_t largest = 99;
    CHECK(frame_error(hello, h.dump() + "\n", &largest) ==
          "steps[1] (prefill, layer 0) answer.frame.bytes: " + bytes + " bytes, over the frame limit of 1 GiB");
    CHECK(largest == 0);
  }
  // Within the guard but not what the shapes make: also refused unread.
  Json h = ok_slots();
  h["frame"] = Json::parse(R"({"dtype":"f64","bytes":1000000,"arrays":[["out",3,8]]})");
  std::size_t largest = 99;
  CHECK_THAT(frame_error(hello, h.dump() + "\n", &largest), Catch::Contains("answer.frame.bytes: the header says"));
  CHECK(largest == 0);
}

TEST_CASE("ExecFrames: a frame the session did not negotiate, or on an answer without rows, is an error") {
  const std::string frame = frame_answer(ok_slots(), {{"out", kRows, kQWidth}});
  CHECK_THAT(frame_error(hello_answer("json"), frame),
             Catch::StartsWith("steps[1] (prefill, layer 0) answer.frame: a binary frame, but this session speaks JSON"));
  CHECK_THAT(frame_error(hello_answer(""), frame),
             Catch::StartsWith("steps[1] (prefill, layer 0) answer.frame: a binary frame, but this session speaks JSON"));
  // A refusal carries no frame, even in a binary session.
  Json refusal = {{"ok", false}, {"error", "state-busy"}};
  CHECK_THAT(frame_error(hello_answer("binary"), frame_answer(refusal, {{"out", kRows, kQWidth}})),
             Catch::StartsWith("steps[1] (prefill, layer 0) answer.frame: a frame on an answer that carries no rows"));
}

TEST_CASE("ExecFrames: an adapter that ends or stalls inside a frame fails the step, bounded in time") {
  // A /bin/sh adapter: answers hello, open and begin, then the prefill's
  // header with a 192-byte frame of which it writes 8 bytes.
  const std::string header =
      R"({"ok":true,"written":[0,1,2],"read":[[0],[0,1],[0,1,2]],"frame":{"dtype":"f64","bytes":192,"arrays":[["out",3,8]]}})";
  const std::string hello = hello_answer("binary");
  const std::string answers = "read -r l; printf '%s' '" + hello.substr(0, hello.size() - 1) +
                              "'; echo; read -r l; echo '{\"ok\":true}'; read -r l; echo '{\"ok\":true}'; read -r l; "
                              "printf '%s\\n' '" +
                              header + "'; printf '\\000\\000\\000\\000\\000\\000\\000\\000'; ";
  auto run = [&](const std::string& tail, double timeout) -> std::string {
    auto provider = en::make_exec_provider(en::start_exec_child(answers + tail, timeout), "sh", en::ExecEncoding::kBinary);
    en::Refusal refused;
    auto cache = provider->open(frame_spec(), &refused);
    REQUIRE(cache);
    const std::vector<double> k = numbers(12, 0), v = numbers(12, 1), q = numbers(24, 2);
    en::StepCall call;
    call.op = en::StepCall::Op::kBegin;
    call.state = 1;
    REQUIRE_FALSE(cache->call(call, nullptr));
    call.op = en::StepCall::Op::kStep;
    call.step.kind = kvcheck::scenarios::StepKind::kPrefill;
    call.step.rows = kRows;
    call.rows = kRows;
    call.step_index = 1;
    call.k = k.data();
    call.v = v.data();
    call.q = q.data();
    en::StepAnswer answer;
    try {
      cache->call(call, &answer);
    } catch (const kvcheck::Error& e) {
      CHECK(e.id() == kvcheck::ErrorId::kAdapter);
      return e.where() + ": " + e.rule();
    }
    return "";
  };
  CHECK_THAT(run("exit 0", 10.0), Catch::StartsWith("steps[1] (prefill, layer 0): the adapter closed its stdout "
                                                    "after 8 of the frame's 192 bytes"));
  // 1 s: long enough for /bin/sh to answer hello, open and begin on a loaded machine.
  CHECK_THAT(run("sleep 5", 1.0), Catch::StartsWith("steps[1] (prefill, layer 0): the adapter sent 8 of the "
                                                    "frame's 192 bytes within 1 s (--step-timeout)"));
}

TEST_CASE("ExecAnswer: padded, moved and freed slots are read, and a malformed one is an error naming the field") {
  const std::string hello = hello_answer("");
  Json j = Json::parse(json_answer());
  j["padded"] = {7, 8};
  j["moved"] = {{0, 5}, {1, 6}};
  j["freed"] = {4};
  const Session s = run_prefill(hello, j.dump() + "\n", en::ExecEncoding::kJson);
  CHECK(s.answer.padded == std::vector<std::int64_t>{7, 8});
  CHECK(s.answer.moved == std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 5}, {1, 6}});
  CHECK(s.answer.freed == std::vector<std::int64_t>{4});
  CHECK(run_prefill(hello, json_answer(), en::ExecEncoding::kJson).answer.freed.empty());
  // A well-formed slot the cache cannot have is read as it is: the checker
  // fails the case at the step (issue 30 item 2), it is not a malformed answer.
  Json impossible = Json::parse(json_answer());
  impossible["padded"] = {1, -1};
  impossible["freed"] = {-4};
  const Session kept = run_prefill(hello, impossible.dump() + "\n", en::ExecEncoding::kJson);
  CHECK(kept.answer.padded == std::vector<std::int64_t>{1, -1});
  CHECK(kept.answer.freed == std::vector<std::int64_t>{-4});

  const std::string at = "steps[1] (prefill, layer 0) answer";
  const std::pair<const char*, std::string> twists[] = {
      {R"({"padded": 3})", at + ".padded: expected an array of slots"},
      {R"({"padded": [1, 9223372036854775808]})", at + ".padded[1]: out of range: 9223372036854775808"},
      {R"({"freed": ["4"]})", at + ".freed[0]: expected an integer"},
      {R"({"moved": [[0, 1], [2]]})", at + ".moved[1]: expected [from, to]: two slots"},
      {R"({"moved": [[0, 1.5]]})", at + ".moved[0][1]: expected an integer"},
      {R"({"moved": {"0": 1}})", at + ".moved: expected an array of [from, to] slot pairs"},
  };
  for (const auto& [extra, expected] : twists) {
    INFO(expected);
    Json bad = Json::parse(json_answer());
    bad.update(Json::parse(extra));
    std::string error;
    try {
      Session t;
      run_prefill_into(t, hello, bad.dump() + "\n", en::ExecEncoding::kJson);
    } catch (const kvcheck::Error& e) {
      error = e.where() + ": " + e.rule();
    }
    CHECK_THAT(error, Catch::StartsWith(expected));
  }
}

TEST_CASE(
    "ExecAnswer: cached slots are read from a cache that declared them, and are an error from one that did "
    "not") {
  Json declared = Json::parse(hello_answer(""));
  declared["capabilities"]["reports"]["cached"] = true;
  Json j = Json::parse(json_answer());
  j["cached"] = {4, 5};
  j["freed"] = {6};
  const Session s = run_prefill(declared.dump() + "\n", j.dump() + "\n", en::ExecEncoding::kJson);
  CHECK(s.answer.cached == std::vector<std::int64_t>{4, 5});
  CHECK(s.answer.freed == std::vector<std::int64_t>{6});
  const std::pair<std::string, std::string> twists[] = {
      {hello_answer(""), ".cached: cached slots from a cache that did not declare them"},
      {declared.dump() + "\n", ".cached[1]: expected an integer"},
  };
  Json bad = Json::parse(json_answer());
  for (const auto& [hello, expected] : twists) {
    INFO(expected);
    bad["cached"] = Json::array({4, "5"});
    std::string error;
    try {
      Session t;
      run_prefill_into(t, hello, bad.dump() + "\n", en::ExecEncoding::kJson);
    } catch (const kvcheck::Error& e) {
      error = e.where() + ": " + e.rule();
    }
    CHECK_THAT(error, Catch::StartsWith("steps[1] (prefill, layer 0) answer" + expected));
  }
}

TEST_CASE(
    "ExecAnswer: recomputed prefix rows are read from a cache that declared recompute_in_step, and are an "
    "error from one that did not or malformed") {
  Json declared = Json::parse(hello_answer(""));
  declared["capabilities"]["recompute_in_step"] = true;
  const std::string hello = declared.dump() + "\n";
  Json j = Json::parse(json_answer());
  j["recomputed"] = {{1, 5}, {2, 6}};
  Session s;
  run_prefill_into(s, hello, j.dump() + "\n", en::ExecEncoding::kJson, 3);
  CHECK(s.answer.recomputed == std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 5}, {2, 6}});
  const std::pair<std::string, std::string> twists[] = {
      {R"([[1, 5]])", ".recomputed: prefix rows recomputed in a step from a cache that did not declare it"},
      {R"([[1]])", ".recomputed[0]: expected [position, slot]"},
      {R"({"1": 5})", ".recomputed: expected an array of [position, slot] pairs"},
      {R"([[3, 5]])", ".recomputed[0][0]: out of range: 3 (0 .. 2)"},  // not below the step's first position
      {R"([[0, "5"]])", ".recomputed[0][1]: expected an integer"},
  };
  for (std::size_t i = 0; i < std::size(twists); ++i) {
    const auto& [list, expected] = twists[i];
    INFO(expected);
    Json bad = Json::parse(json_answer());
    bad["recomputed"] = Json::parse(list);
    std::string error;
    try {
      Session t;
      run_prefill_into(t, i == 0 ? hello_answer("") : hello, bad.dump() + "\n", en::ExecEncoding::kJson, 3);
    } catch (const kvcheck::Error& e) {
      error = e.where() + ": " + e.rule();
    }
    CHECK_THAT(error, Catch::StartsWith("steps[1] (prefill, layer 0) answer" + expected));
  }
}
