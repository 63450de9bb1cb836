// The table of step kinds (scenarios/step_kinds.hpp) is the single source:
// every kind's name parses back, round-trips through the scenario file and a
// trace record carrying exactly the fields the table gives it, the schemas
// name every kind, and the request lifecycle (RequestLifecycle) holds its rules.
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "scenarios/scenario_json.hpp"
#include "scenarios/step_kinds.hpp"
#include "scenarios/step_semantics.hpp"
#include "scenarios/trace.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"

namespace {

using namespace kvcheck::scenarios;

/// The JSON keys of a step of `kind`, beside "kind" and "request".
std::set<std::string> field_keys(StepKind kind) {
  switch (step_kind_fields(kind)) {
    case StepFields::kRowsOrder: return {"rows", "order"};
    case StepFields::kDrafts: return {"drafts"};
    case StepFields::kAccepted: return {"accepted"};
    case StepFields::kPositions: return {"positions"};
    case StepFields::kNone: return {};
  }
  return {};
}

/// A step of `kind` with every field its kind carries set (prefill 3 rows
/// store_then_load, verify 2 drafts, accept 1, trim 2), the other fields at their defaults.
Step step_of(StepKind kind) {
  Step s;
  s.kind = kind;
  switch (step_kind_fields(kind)) {
    case StepFields::kRowsOrder:
      s.rows = 3;
      s.order = Order::kStoreThenLoad;
      break;
    case StepFields::kDrafts: s.drafts = 2; break;
    case StepFields::kAccepted: s.accepted = 1; break;
    case StepFields::kPositions: s.positions = 2; break;
    case StepFields::kNone: break;
  }
  return s;
}

}  // namespace

TEST_CASE("StepKinds: every name parses back to its kind, and an unknown name does not") {
  REQUIRE(kStepKindCount == static_cast<int>(std::size(kStepKinds)));
  std::set<std::string_view> names;
  for (int i = 0; i < kStepKindCount; ++i) {
    const auto kind = static_cast<StepKind>(i);
    REQUIRE(kStepKinds[i] == kind);
    StepKind parsed = StepKind::kReset;
    REQUIRE(parse_step_kind(step_kind_name(kind), &parsed));
    CHECK(parsed == kind);
    CHECK(names.insert(step_kind_name(kind)).second);
    // Trace kinds are the step kinds, value for value, and the names agree.
    CHECK(trace_step_kind(trace_kind(kind)) == kind);
    CHECK(trace_kind_name(trace_kind(kind)) == step_kind_name(kind));
    CHECK(trace_kind_writes(trace_kind(kind)) == step_kind_writes_rows(kind));
  }
  StepKind untouched = StepKind::kDecode;
  CHECK_FALSE(parse_step_kind("begin", &untouched));
  CHECK_FALSE(parse_step_kind("Decode", &untouched));
  CHECK(untouched == StepKind::kDecode);
  CHECK(trace_kind_name(TraceKind::kBegin) == "begin");
  CHECK_FALSE(trace_kind_writes(TraceKind::kBegin));
}

TEST_CASE("StepKinds: rows written per kind: prefill n, decode 1, verify k+1, the others none") {
  for (const StepKind kind : kStepKinds) {
    Step s = step_of(kind);
    const std::int64_t expected = kind == StepKind::kPrefill  ? 3
                                  : kind == StepKind::kDecode ? 1
                                  : kind == StepKind::kVerify ? 3
                                                              : 0;
    INFO(step_kind_name(kind));
    CHECK(step_rows(s) == expected);
    CHECK(step_kind_writes_rows(kind) == (expected > 0));
  }
  CHECK(step_kind_ends_request(StepKind::kFinish));
  CHECK_FALSE(step_kind_ends_request(StepKind::kReset));
}

TEST_CASE("StepKinds: every kind round-trips through a scenario file with exactly its fields") {
  // prefill, verify(2), accept(1), trim(2), then each remaining kind, finish last.
  Scenario sc;
  sc.name = "every-step-kind";
  sc.cache.window = sc.cache.ring_rows = 16;
  sc.requests = {{0, 0}};
  std::vector<StepKind> order = {StepKind::kPrefill, StepKind::kVerify, StepKind::kAccept, StepKind::kTrim};
  for (const StepKind kind : kStepKinds) {
    if (kind != StepKind::kPrefill && kind != StepKind::kVerify && kind != StepKind::kAccept &&
        kind != StepKind::kTrim && !step_kind_ends_request(kind)) {
      order.push_back(kind);
    }
  }
  for (const StepKind kind : kStepKinds) {
    if (step_kind_ends_request(kind)) order.push_back(kind);
  }
  REQUIRE(order.size() == std::size(kStepKinds));
  for (const StepKind kind : order) sc.steps.push_back(step_of(kind));

  const std::string text = save_scenario(sc);
  const Scenario back = parse_scenario(text, "");
  REQUIRE(back == sc);
  const auto doc = nlohmann::json::parse(text);
  REQUIRE(doc["steps"].size() == sc.steps.size());
  for (std::size_t i = 0; i < sc.steps.size(); ++i) {
    const auto& j = doc["steps"][i];
    INFO(j.dump());
    CHECK(j["kind"] == std::string(step_kind_name(sc.steps[i].kind)));
    std::set<std::string> keys;
    for (const auto& [key, value] : j.items()) keys.insert(key);
    std::set<std::string> expected = field_keys(sc.steps[i].kind);
    expected.insert({"kind", "request"});
    CHECK(keys == expected);
  }
}

TEST_CASE("StepKinds: every kind and begin round-trip through a trace record") {
  TraceHeader header;
  header.name = "kinds";
  header.window = 4;
  header.capacity = 16;
  header.states = 1;
  header.addressing = Addressing::kRing;
  std::string text = trace_header_line(header);
  // begin, prefill(3), verify(2), accept(1), trim(2), then the rest: each record at its logical position.
  std::vector<TraceStep> records;
  TraceStep begin;
  begin.kind = TraceKind::kBegin;
  records.push_back(begin);
  RequestProgress progress;
  std::vector<StepKind> order = {StepKind::kPrefill, StepKind::kVerify, StepKind::kAccept, StepKind::kTrim};
  for (const StepKind kind : kStepKinds) {
    if (kind != StepKind::kPrefill && kind != StepKind::kVerify && kind != StepKind::kAccept &&
        kind != StepKind::kTrim) {
      order.push_back(kind);
    }
  }
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Step s = step_of(order[i]);
    TraceStep r;
    r.step = static_cast<std::int64_t>(i);
    r.kind = trace_kind(s.kind);
    if (step_kind_writes_rows(s.kind)) {
      r.position = step_first_position(progress);
      r.rows = step_rows(s);
      r.order = s.order;
      r.drafts = s.drafts;
      for (std::int64_t q = 0; q < r.rows; ++q) {
        r.written.push_back(r.position + q);
        r.read.push_back({r.position + q});
      }
      r.read_form = ReadForm::kSlots;
    }
    r.accepted = s.accepted;
    r.positions = s.positions;
    REQUIRE(advance(progress, s) == StepRefusal::kNone);
    records.push_back(r);
  }
  for (const TraceStep& r : records) text += trace_step_line(r);
  const auto runs = parse_trace(text);
  REQUIRE(runs.size() == 1);
  REQUIRE(runs[0].steps.size() == records.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    const TraceStep& got = runs[0].steps[i];
    INFO(trace_kind_name(records[i].kind));
    CHECK(got.kind == records[i].kind);
    CHECK(trace_record_step(got) == trace_record_step(records[i]));
    CHECK(got.rows == records[i].rows);
  }
}

TEST_CASE("RequestLifecycle: a request takes its state at its first step, finish frees it, reset keeps it") {
  RequestLifecycle life;
  using Phase = RequestLifecycle::Phase;
  CHECK(life.phase(7) == Phase::kIdle);
  CHECK(life.may_hold(7, 0));
  Step decode;
  decode.kind = StepKind::kDecode;
  REQUIRE(life.step(7, 0, decode) == StepRefusal::kNone);  // begins at its first step
  CHECK(life.phase(7) == Phase::kActive);
  CHECK(life.holder(0) == 7);
  CHECK(life.progress(7).length == 1);
  CHECK_FALSE(life.may_hold(8, 0));  // one active request per state
  CHECK(life.may_hold(8, 1));

  Step accept;
  accept.kind = StepKind::kAccept;
  CHECK(life.step(7, 0, accept) == StepRefusal::kAcceptWithoutVerify);  // refused: nothing changes
  CHECK(life.progress(7).length == 1);
  CHECK(life.holder(0) == 7);

  Step reset;
  reset.kind = StepKind::kReset;
  REQUIRE(life.step(7, 0, reset) == StepRefusal::kNone);
  CHECK(life.phase(7) == Phase::kActive);  // reset keeps the state
  CHECK(life.holder(0) == 7);
  CHECK(life.progress(7).length == 0);

  Step finish;
  finish.kind = StepKind::kFinish;
  REQUIRE(life.step(7, 0, finish) == StepRefusal::kNone);
  CHECK(life.phase(7) == Phase::kFinished);
  CHECK_FALSE(life.holder(0).has_value());
  CHECK(life.may_hold(8, 0));

  life.begin(8, 0);  // an explicit begin takes the freed state
  CHECK(life.holder(0) == 8);
  CHECK(life.phase(8) == Phase::kActive);
  life.begin(7, 1);  // and a finished request may begin again, afresh
  CHECK(life.phase(7) == Phase::kActive);
  CHECK(life.progress(7).length == 0);
}

TEST_CASE("StepKinds: the schemas name every step kind, and the exec schema every capability") {
  // The schemas list the kinds by hand (grouped by their fields): a kind added
  // to the table fails here until each schema names it.
  for (const char* schema : {"scenario.schema.json", "trace.schema.json", "exec-protocol.schema.json"}) {
    INFO(schema);
    std::ifstream in(std::string(KVCHECK_SCENARIO_DIR) + "/schema/" + schema);
    REQUIRE(in);
    std::stringstream text;
    text << in.rdbuf();
    std::set<std::string> strings;
    const std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& j) {
      if (j.is_string()) strings.insert(j.get<std::string>());
      if (j.is_structured()) {
        for (const auto& v : j) walk(v);
      }
    };
    walk(nlohmann::json::parse(text.str()));
    for (const StepKind kind : kStepKinds) CHECK(strings.count(std::string(step_kind_name(kind))) == 1);
    if (std::string(schema) == "exec-protocol.schema.json") {
      for (int i = 0; i < kStepCapabilityCount; ++i) {
        CHECK(strings.count(std::string(step_capability_info(static_cast<StepCapability>(i)).name)) == 1);
      }
    }
  }
}

TEST_CASE("StepKinds: trim(n) rewinds the committed length, drops a pending verify first, refuses n outside 1..L") {
  Step prefill;
  prefill.kind = StepKind::kPrefill;
  prefill.rows = 5;
  Step trim;
  trim.kind = StepKind::kTrim;
  RequestProgress p;
  REQUIRE(advance(p, prefill) == StepRefusal::kNone);
  trim.positions = 2;
  REQUIRE(advance(p, trim) == StepRefusal::kNone);
  CHECK(p.length == 3);
  CHECK(step_first_position(p) == 3);  // the next write goes where the trimmed rows were
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{4}}) {
    trim.positions = bad;
    const RequestProgress before = p;
    CHECK(advance(p, trim) == (bad < 1 ? StepRefusal::kTrimNone : StepRefusal::kTrimTooMany));
    CHECK(p == before);
  }
  // verify(2) at 3 writes 3..5; a trim while it is pending drops its rows and
  // counts n from the committed length 3, not from the speculative 6.
  Step verify;
  verify.kind = StepKind::kVerify;
  verify.drafts = 2;
  REQUIRE(advance(p, verify) == StepRefusal::kNone);
  trim.positions = 4;
  CHECK(advance(p, trim) == StepRefusal::kTrimTooMany);
  CHECK(p.pending());
  trim.positions = 3;
  REQUIRE(advance(p, trim) == StepRefusal::kNone);
  CHECK(p == RequestProgress{});

  // Scenario files: the error names the field at fault.
  Scenario sc;
  sc.name = "trim";
  sc.cache.window = sc.cache.ring_rows = 8;
  sc.requests = {{0, 0}};
  prefill.request = trim.request = 0;
  sc.steps = {prefill, trim};
  sc.steps[1].positions = 6;
  try {
    validate_scenario(sc);
    FAIL("trim(6) of 5 positions validated");
  } catch (const kvcheck::Error& e) {
    CHECK(e.where() == "steps[1].positions");
    CHECK(e.rule() == "trim 6 exceeds the 5 committed positions of request 0");
  }
  sc.steps[1].positions = 5;
  validate_scenario(sc);  // down to nothing is allowed
  Step decode;
  decode.kind = StepKind::kDecode;
  decode.positions = 1;
  sc.steps.push_back(decode);
  try {
    validate_scenario(sc);
    FAIL("a decode with positions validated");
  } catch (const kvcheck::Error& e) {
    CHECK(e.where() == "steps[2].positions");
  }
}
