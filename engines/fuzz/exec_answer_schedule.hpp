// The fixed exchange the exec answer-parser fuzzer replays: hello, open of a
// small cache, then begin, prefill(3), decode, verify(2), accept(1) and
// finish of one request, begin and reset of another, each answer read by the
// same ExecProvider and ExecCache code as a live adapter's. The answers come
// from a transport: from memory (one input line per request, in order; what
// the fuzzer mutates) or from a live adapter whose answers are recorded (how
// the bundled seeds in engines/fuzz/seeds/ were made).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "engines/exec_cache.hpp"
#include "engines/exec_transport.hpp"
#include "support/error.hpp"

namespace kvcheck::engines::fuzz {

/// Answers from memory: line i of `input` answers request i.
class MemoryTransport final : public ExecTransport {
 public:
  explicit MemoryTransport(std::string_view input) : input_(input) {}
  void send(std::string_view, const std::string&) override {}
  std::string receive(const std::string& where) override {
    const auto nl = input_.find('\n');
    if (nl == std::string_view::npos) fail(where, "the adapter closed its stdout");
    std::string line(input_.substr(0, nl));
    input_.remove_prefix(nl + 1);
    return line;
  }

 protected:
  std::string on_failure(const std::string& what) override { return what; }

 private:
  std::string_view input_;
};

/// A live transport whose answer lines are appended to `record`.
class RecordingTransport final : public ExecTransport {
 public:
  RecordingTransport(std::unique_ptr<ExecTransport> inner, std::string* record)
      : inner_(std::move(inner)), record_(record) {}
  void send(std::string_view line, const std::string& where) override { inner_->send(line, where); }
  std::string receive(const std::string& where) override {
    std::string line = inner_->receive(where);
    *record_ += line + "\n";
    return line;
  }

 protected:
  // The inner transport's own failure path (it stops the adapter).
  std::string on_failure(const std::string& what) override {
    try {
      inner_->fail("", what);
    } catch (const Error& e) {
      return e.rule();
    }
    return what;
  }

 private:
  std::unique_ptr<ExecTransport> inner_;
  std::string* record_;
};

/// Aborts (a finding) when an accepted answer has the wrong shape.
inline void require(bool ok) {
  if (!ok) std::abort();
}

/// Runs the schedule over `transport`; returns the number of calls answered
/// (hello and open included: 10 when every call went through). Throws
/// kvcheck::Error for a bad answer, as a live run does.
inline int run_answer_schedule(std::unique_ptr<ExecTransport> transport) {
  using scenarios::StepKind;
  auto provider = make_exec_provider(std::move(transport), "fuzz");
  int answered = 1;
  CacheSpec spec;
  spec.cache.window = 4;
  spec.cache.ring_rows = 8;
  spec.cache.states = 2;
  spec.cache.q_heads = 2;
  spec.cache.kv_heads = 1;
  spec.cache.head_dim = 4;
  spec.cache.format = scenarios::Format::kF32;
  spec.cache.rope = {scenarios::RopeStyle::kNeox, 4, 10000.0};
  spec.window_keys = 4;
  spec.max_step_rows = 3;
  spec.softmax_scale = 0.5;
  Refusal refused;
  auto cache = provider->open(spec, &refused);
  if (!cache) return answered;
  ++answered;
  const std::int64_t kv_width = spec.cache.kv_heads * spec.cache.head_dim;
  const std::int64_t q_width = spec.cache.q_heads * spec.cache.head_dim;
  // [3, kv_width] keys and values, [3, q_width] queries: small distinct numbers.
  std::vector<double> k(3 * kv_width), v(3 * kv_width), q(3 * q_width);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = 0.125 * static_cast<double>(i % 7) - 0.25;
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.5 - 0.0625 * static_cast<double>(i % 5);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.25 * static_cast<double>(i % 3) - 0.125;
  struct Call {
    StepCall::Op op;
    StepKind kind;
    std::int64_t request, position, rows, drafts, accepted;
  };
  const Call calls[] = {{StepCall::Op::kBegin, StepKind::kDecode, 0, 0, 0, 0, 0},
                        {StepCall::Op::kStep, StepKind::kPrefill, 0, 0, 3, 0, 0},
                        {StepCall::Op::kStep, StepKind::kDecode, 0, 3, 1, 0, 0},
                        {StepCall::Op::kStep, StepKind::kVerify, 0, 4, 3, 2, 0},
                        {StepCall::Op::kStep, StepKind::kAccept, 0, 0, 0, 0, 1},
                        {StepCall::Op::kStep, StepKind::kFinish, 0, 0, 0, 0, 0},
                        {StepCall::Op::kBegin, StepKind::kDecode, 1, 0, 0, 0, 0},
                        {StepCall::Op::kStep, StepKind::kReset, 1, 0, 0, 0, 0}};
  StepAnswer answer;
  for (std::size_t i = 0; i < std::size(calls); ++i) {
    const Call& c = calls[i];
    StepCall call;
    call.op = c.op;
    call.step.kind = c.kind;
    call.step.request = c.request;
    call.step.rows = c.kind == StepKind::kPrefill ? c.rows : 0;
    call.step.order = scenarios::Order::kStoreThenLoad;
    call.step.drafts = c.drafts;
    call.step.accepted = c.accepted;
    call.state = 1;
    call.position = c.position;
    call.rows = c.rows;
    call.step_index = static_cast<std::int64_t>(i);
    call.k = k.data();
    call.v = v.data();
    call.q = q.data();
    if (cache->call(call, &answer)) return answered;  // a refusal ends the case
    ++answered;
    if (c.rows == 0) continue;
    // What an accepted answer must look like, whatever the input.
    const auto rows = static_cast<std::size_t>(c.rows);
    require(answer.out.size() == rows * static_cast<std::size_t>(q_width));
    require(!answer.has_written || answer.written.size() == rows);
    require(!answer.has_reads ||
            (answer.read_offsets.size() == rows + 1 &&
             answer.read_offsets.back() == static_cast<std::int64_t>(answer.read_slots.size())));
    require(!answer.has_stored || (answer.stored_k.size() == rows * static_cast<std::size_t>(kv_width) &&
                                   answer.stored_v.size() == rows * static_cast<std::size_t>(kv_width)));
  }
  return answered;
}

}  // namespace kvcheck::engines::fuzz
