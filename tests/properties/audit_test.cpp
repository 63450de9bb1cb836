// Recorded traces: parsing (errors name the line and the JSON path), block
// table expansion, the bundled paged-engine traces, and recordings of live
// runs, which must audit to the live run's verdict and numbers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engines/factory.hpp"
#include "engines/trace_cache.hpp"
#include "impl/kv_cache.hpp"
#include "properties/audit.hpp"
#include "properties/rows.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"
#include "tests/properties/bundled_files.hpp"

using namespace kvcheck;
using namespace kvcheck::properties;
using kvcheck::test::bundled;

namespace {

const std::string kHeader =
    R"({"kvcheck_trace":1,"name":"t","window":{"param":3,"convention":"keys"},"addressing":"paged"})";

/// where() of the error parsing `text` throws, or "no error".
std::string parse_where(const std::string& text) {
  try {
    scenarios::parse_trace(text, "");
  } catch (const Error& e) {
    return e.where();
  }
  return "no error";
}

/// where() of the error auditing `text` throws, or "no error".
std::string audit_where(const std::string& text) {
  try {
    audit_trace(scenarios::parse_trace(text, ""), AuditOptions{});
  } catch (const Error& e) {
    return e.where();
  }
  return "no error";
}

std::string lines(std::initializer_list<std::string> records) {
  std::string out;
  for (const auto& r : records) out += r + "\n";
  return out;
}

std::vector<scenarios::TraceRun> bundled_trace(const std::string& name) {
  return scenarios::load_trace_file(std::filesystem::path(KVCHECK_SOURCE_DIR) / "traces" / (name + ".jsonl"));
}

/// Per step: the overwritten list of each query.
std::vector<std::vector<std::vector<std::int64_t>>> overwritten(const RunObservation& run) {
  std::vector<std::vector<std::vector<std::int64_t>>> out;
  for (const auto& s : run.steps) {
    out.emplace_back();
    for (const auto& q : s.queries) out.back().push_back(q.overwritten);
  }
  return out;
}

std::vector<std::vector<std::vector<std::int64_t>>> missing(const RunObservation& run) {
  std::vector<std::vector<std::vector<std::int64_t>>> out;
  for (const auto& s : run.steps) {
    out.emplace_back();
    for (const auto& q : s.queries) out.back().push_back(q.missing);
  }
  return out;
}

struct Recorded {
  RunObservation live;
  std::string trace;
  RunObservation audited;
  std::string note;           ///< why outputs were not judged
  scenarios::Scenario built;  ///< the scenario the audit built from the recording
};

/// Runs `sc` on the CPU ring pool (with `fault`) through the recording
/// provider, then audits the recording.
Recorded record_and_audit(const scenarios::Scenario& sc, impl::Fault fault, bool probes = false) {
  auto writer = std::make_shared<scenarios::TraceWriter>();
  auto recorder = engines::make_recording_provider(
      engines::make_provider("cpu", std::string(impl::fault_name(fault))), writer, "unnamed");
  recorder->set_scenario(sc);
  RunOptions options;
  options.provider = recorder.get();
  options.fault = impl::fault_name(fault);
  options.probes = probes;
  options.precision_bits = 53;
  Recorded r;
  r.live = run_scenario(sc, options);
  writer->check();
  r.trace = writer->text();
  const auto runs = scenarios::parse_trace(r.trace, "recording");
  REQUIRE(runs.size() == 1);
  CHECK(runs.front().header.name == sc.name);
  CHECK(runs.front().header.expect == sc.expect);
  AuditOptions audit;
  audit.precision_bits = 53;
  const auto audited = audit_trace(runs, audit);
  REQUIRE(audited.size() == 1);
  r.audited = audited.front();
  const TraceScenario ts = trace_scenario(runs.front());
  r.note = ts.outputs_note;
  r.built = ts.scenario;
  return r;
}

void check_same(const Recorded& r, bool outputs_judged) {
  INFO(r.note);
  CHECK(r.audited.passed == r.live.passed);
  CHECK(overwritten(r.audited) == overwritten(r.live));
  CHECK(missing(r.audited) == missing(r.live));
  CHECK(r.audited.lost_rows == r.live.lost_rows);
  CHECK(r.audited.extra_reads == r.live.extra_reads);
  CHECK(r.audited.collisions == r.live.collisions);
  CHECK(r.audited.queries == r.live.queries);
  CHECK(r.audited.steps.size() == r.live.steps.size());
  if (outputs_judged) {
    CHECK(r.audited.observed == "slots+outputs");
    CHECK(r.audited.max_abs_diff == r.live.max_abs_diff);  // exactly: the numbers round-trip
    CHECK(r.audited.max_eps_units == r.live.max_eps_units);
    CHECK(r.audited.max_quant_abs_diff == r.live.max_quant_abs_diff);
    CHECK(r.audited.output_failures == r.live.output_failures);
  } else {
    CHECK(r.audited.observed == "slots");
  }
}

}  // namespace

TEST_CASE("Trace: parse errors name the line and the JSON path") {
  const std::string decode = R"({"step":0,"layer":0,"kind":"decode","request":0,"state":0,"position":0)";
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0,1],"read":[[0]]})"})) == "line 2: written");
  CHECK(parse_where(lines({kHeader, "", decode + R"(,"written":[0],"read":[[0,1,"x"]]})"})) ==
        "line 3: read[0][2]");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0],"read":[[0]],"extra":1})"})) ==
        "line 2: extra");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0],"written":[0],"read":[[0]]})"})) ==
        "line 2: written");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0]})"})) == "line 2: read");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0],"read":[[0]],"read_view":"later"})"})) ==
        "line 2: read_view");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[-2],"read":[[0]]})"})) == "line 2: written[0]");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0],"read":[[0]],"accepted":1})"})) ==
        "line 2: accepted");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0],"read":[[0]],"k":[[1e999]]})"})) ==
        "line 2: k[0][0]");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0],"read":[[0]]})", "{\"step\":"}))
            .rfind("line 3", 0) == 0);
  CHECK(parse_where(lines({decode + R"(,"written":[0],"read":[[0]]})"})) == "line 1");
  CHECK(parse_where(lines(
            {kHeader,
             decode + R"(,"written":[0],"block_table":{"blocks":[0],"block_size":2,"seq_lens":[3]}})"})) ==
        "line 2: block_table.seq_lens[0]");
  CHECK(
      parse_where(lines(
          {R"({"kvcheck_trace":2,"name":"t","window":{"param":3,"convention":"keys"},"addressing":"paged"})"})) ==
      "line 1: kvcheck_trace");
  CHECK(
      parse_where(lines(
          {R"({"kvcheck_trace":1,"name":"t","window":{"param":3,"convention":"right"},"addressing":"paged"})"})) ==
      "line 1: window.convention");
  CHECK(
      parse_where(lines(
          {R"({"kvcheck_trace":1,"name":"t","window":{"param":3,"convention":"keys"},"addressing":"ring"})"})) ==
      "line 1: capacity");
  CHECK(
      parse_where(lines(
          {R"({"kvcheck_trace":1,"name":"t","window":{"param":3,"convention":"keys"},"addressing":"paged","cache":{"head_dim":2}})",
           decode + R"(,"written":[0],"read":[[0]],"q":[[1,2,3]]})"})) == "line 2: q[0]");
  // Record order: step indices, layers, refusals.
  const std::string finish = R"({"step":1,"layer":0,"kind":"finish","request":0,"state":0})";
  CHECK(parse_where(lines({kHeader, R"({"step":1,"layer":0,"kind":"finish","request":0,"state":0})"})) ==
        "line 2: step");
  CHECK(parse_where(lines({kHeader, decode + R"(,"refused":"full: no room"})", finish})) == "line 3");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0],"read":[[0]],"refused":"full: no room"})"})) ==
        "line 2: written");
  CHECK(
      parse_where(lines(
          {kHeader, decode + R"(,"written":[0],"read":[[0]]})",
           R"({"step":0,"layer":1,"kind":"decode","request":0,"state":0,"position":1,"written":[1],"read":[[1]]})"})) ==
      "line 3: position");
  CHECK(parse_where(lines({kHeader, decode + R"(,"written":[0],"read":[[0]]})",
                           R"({"step":1,"layer":1,"kind":"finish","request":0,"state":0})"})) ==
        "line 2: step");
  // The file name follows the rule.
  try {
    scenarios::parse_trace(lines({kHeader, decode + "}"}), "engine.jsonl");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.where() == "line 2: written");
    CHECK(std::string(e.what()).find("(in engine.jsonl)") != std::string::npos);
  }
}

TEST_CASE("Trace: block tables expand to the slots of each query's window") {
  scenarios::TraceStep s;
  s.kind = scenarios::TraceKind::kVerify;
  s.rows = 3;
  s.drafts = 2;
  s.read_form = scenarios::ReadForm::kBlockTable;
  s.block_table.blocks = {7, -1, 2};
  s.block_table.block_size = 4;
  s.block_table.seq_lens = {3, 6, 11};
  const auto reads = scenarios::trace_read_slots(s, 6);
  REQUIRE(reads.size() == 3);
  CHECK(reads[0] == std::vector<std::int64_t>{28, 29, 30});      // positions 0..2 in block 7
  CHECK(reads[1] == std::vector<std::int64_t>{28, 29, 30, 31});  // 0..5; 4, 5 in a missing block
  CHECK(reads[2] == std::vector<std::int64_t>{8, 9, 10});        // 5..10: 5..7 missing, 8..10 in block 2
  s.block_table.seq_lens = {3, 6, 13};
  CHECK_THROWS_AS(scenarios::trace_read_slots(s, 6), Error);
}

TEST_CASE("Trace: the writer's lines read back to the same records, numbers exactly") {
  scenarios::TraceHeader h;
  h.name = "round trip";
  h.window = 5;
  h.convention = scenarios::Convention::kLeft;
  h.capacity = 9;
  h.states = 2;
  h.addressing = scenarios::Addressing::kRing;
  scenarios::TraceCache c;
  c.q_heads = 2;
  c.head_dim = 2;
  c.softmax_scale = 0.1;
  c.layers = 1;
  h.cache = c;
  scenarios::Expectations e;
  e.overwritten = {{0, {0, 1}}};
  e.collisions = 2;
  e.output_tolerance = 1e-9;
  h.expect = e;
  scenarios::TraceStep s;
  s.line = 2;
  s.kind = scenarios::TraceKind::kPrefill;
  s.rows = 2;
  s.order = scenarios::Order::kLoadThenStore;
  s.written = {3, 4};
  s.read_form = scenarios::ReadForm::kSlots;
  s.read = {{3, -1}, {3, 4}};
  s.read_view = scenarios::TraceReadView::kCausal;
  s.k = {{0.1, 1.0 / 3.0}, {1e-300, -2.5e17}};
  s.v = {{5e-324, 0.7}, {-0.0, 1.7976931348623157e308 / 1e291}};
  s.q = {{1, 2, 3, 4}, {0.30000000000000004, 5, 6, 7}};
  s.out = {{0.1, 0.2, 0.3, 0.4}, {1.0 / 7.0, 2.0 / 7.0, 3.0 / 7.0, 4.0 / 7.0}};
  scenarios::TraceWriter writer;
  writer.header(h);
  writer.step(s);
  const auto runs = scenarios::parse_trace(writer.text(), "");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].header == h);
  REQUIRE(runs[0].steps.size() == 1);
  CHECK(runs[0].steps[0] == s);
}

TEST_CASE("Audit: the bundled paged engine trace passes") {
  const auto runs = bundled_trace("paged-engine-ok");
  REQUIRE(runs.size() == 1);
  const auto audited = audit_trace(runs, AuditOptions{});
  REQUIRE(audited.size() == 1);
  const RunObservation& run = audited[0];
  INFO(run.first_failure);
  CHECK(run.passed);
  CHECK(run.observed == "slots");  // no rows or outputs in the trace
  CHECK(run.queries == 8 + 4 + 4 + 1 + 1 + 1 + 1);
  CHECK(run.lost_rows == 0);
  CHECK(run.extra_reads == 0);
  CHECK(run.collisions == 0);
  CHECK(run.window_keys == 6);
  CHECK(run.ring_rows == 18);  // 1 + the largest slot (17)
}

TEST_CASE("Audit: the early-free paged engine reads a slot the other request overwrote") {
  const auto runs = bundled_trace("paged-engine-early-free");
  const auto audited = audit_trace(runs, AuditOptions{});
  REQUIRE(audited.size() == 1);
  const RunObservation& run = audited[0];
  CHECK_FALSE(run.passed);
  // Block 0 (request 0, positions 0..3) went to request 1's drafts 4..7 at
  // step 2; request 0's decode at position 8 (step 4) still reads position 3
  // there, now holding request 1's rejected draft at position 7.
  using L = std::vector<std::vector<std::int64_t>>;
  const std::vector<L> expected = {L(8), L(4), L(4), L{{3}},
                                   L(1), L(1), L(1)};  // per writing step (accept and finish run no query)
  std::vector<L> got;
  for (const auto& s : run.steps) {
    if (s.queries.empty()) continue;
    got.emplace_back();
    for (const auto& q : s.queries) got.back().push_back(q.overwritten);
  }
  CHECK(got == expected);
  CHECK(run.lost_rows == 1);
  CHECK(run.extra_reads == 0);
  REQUIRE(run.first_failing_step >= 0);
  const StepObservation& bad = run.steps[static_cast<std::size_t>(run.first_failing_step)];
  CHECK(bad.step == 4);
  CHECK(bad.request == 0);
  CHECK(bad.queries[0].position == 8);
  REQUIRE(bad.queries[0].reads.size() == 6);
  // Writes are numbered from 1: 8 prefill rows, 4 more, then the drafts 4..7 as 13..16.
  CHECK(bad.queries[0].reads[0] == ReadTag{3, 1, 7, 16});
}

TEST_CASE(
    "Audit: the bundled recordings of the paged adapter's shared pool: a block handed to two layers fails") {
  // `check --record` of paged_cache.py --bug shared-pool-double (its
  // counterexample: 4 layers, one prefill of 5 rows, window 2), and `replay
  // --record` of that counterexample on paged_cache.py --shared-pool.
  const auto bad = bundled_trace("recorded-paged-adapter-shared-pool-double");
  REQUIRE(bad.size() == 1);
  CHECK(bad[0].header.shared_pool);
  const auto bad_audit = audit_trace(bad, AuditOptions{});
  REQUIRE(bad_audit.size() == 1);
  CHECK_FALSE(bad_audit[0].passed);
  CHECK(bad_audit[0].lost_rows == 0);
  CHECK_THAT(
      bad_audit[0].first_failure,
      Catch::Contains("1 other-layer collisions (expected 0 in all); first other-layer: layer 1 wrote slot 4 "
                      "holding request 0 position 4 on layer 0, which layer 0 still sees"));
  // The same records as pools of their own: nothing to judge.
  auto own_pools = bad;
  own_pools[0].header.shared_pool = false;
  CHECK(audit_trace(own_pools, AuditOptions{})[0].passed);
  const auto good = bundled_trace("recorded-paged-adapter-shared-pool");
  REQUIRE(good.size() == 1);
  CHECK(good[0].header.shared_pool);
  const auto good_audit = audit_trace(good, AuditOptions{});
  REQUIRE(good_audit.size() == 1);
  INFO(good_audit[0].first_failure);
  CHECK(good_audit[0].passed);
  CHECK(good_audit[0].observed == "slots+outputs");
  CHECK(good_audit[0].pool_blocks == 24);  // the recorded pool, all four layers together
}

TEST_CASE("Audit: a recording of a passing run audits to the live verdict and numbers") {
  const Recorded r = record_and_audit(bundled("verify-s134"), impl::Fault::kNone);
  CHECK(r.live.passed);
  check_same(r, true);
  CHECK(r.audited.max_abs_diff > 0);
}

TEST_CASE("Audit: a recording of a faulted run fails the same way") {
  const Recorded r = record_and_audit(bundled("verify-s134"), impl::Fault::kWindowTooNarrow);
  CHECK_FALSE(r.live.passed);
  check_same(r, true);
  CHECK(r.audited.lost_rows > 0);
}

TEST_CASE("Audit: recordings of every bundled scenario audit to the replayed verdict") {
  // Expectations travel in the header: verify-s128 expects lost rows and passes both ways.
  const auto files = scenarios::collect_scenario_files({std::string(KVCHECK_SOURCE_DIR) + "/scenarios/fast"});
  REQUIRE(files.size() >= 12);
  for (const auto& f : files) {
    INFO(f.string());
    const Recorded r = record_and_audit(scenarios::load_scenario_file(f), impl::Fault::kNone);
    CHECK(r.live.passed);
    check_same(r, true);  // rows and outputs recorded for every step, rewritten positions included
  }
}

TEST_CASE("Audit: recordings of GQA, RoPE, shared rows and several layers keep their rows exactly") {
  // Every accept takes all drafts, so no position is written twice.
  scenarios::Scenario gqa = bundled("gqa-bf16-interleaved-rope");
  std::map<std::int64_t, std::int64_t> drafts;  // request -> drafts of its pending verify
  for (auto& step : gqa.steps) {
    if (step.kind == scenarios::StepKind::kVerify) drafts[step.request] = step.drafts;
    if (step.kind == scenarios::StepKind::kAccept) step.accepted = drafts.at(step.request);
  }
  scenarios::Scenario layered = bundled("verify-s134");
  layered.cache.layers = 3;
  layered.name = "verify-s134-3-layers";
  for (const auto& sc :
       {gqa, bundled("fp8-shared-row-neox"), bundled("ring-trace-w128-s134-state2"), layered}) {
    INFO(sc.name);
    const Recorded r = record_and_audit(sc, impl::Fault::kNone);
    CHECK(r.live.passed);
    check_same(r, true);
  }
}

TEST_CASE("Audit: recordings of every bundled fault regression fail the same way") {
  const auto files =
      scenarios::collect_scenario_files({std::string(KVCHECK_SOURCE_DIR) + "/scenarios/regressions"});
  int audited = 0;
  for (const auto& f : files) {
    const std::string stem = f.stem().string();
    if (stem.rfind("fault-", 0) != 0) continue;
    impl::Fault fault = impl::Fault::kNone;
    REQUIRE(impl::parse_fault(stem.substr(6), &fault));
    INFO(stem);
    const Recorded r = record_and_audit(scenarios::load_scenario_file(f), fault);
    CHECK_FALSE(r.live.passed);
    check_same(r, true);
    ++audited;
  }
  CHECK(audited >= 8);
}

std::size_t stepped_rows(const scenarios::Scenario& sc) {
  std::size_t n = 0;
  for (const auto& row : sc.data.rows) n += row.step.has_value() ? 1 : 0;
  return n;
}

TEST_CASE("Audit: rewritten positions get rows per step, and outputs are judged with the live numbers") {
  for (const char* name :
       {"verify-reject-then-decode", "gqa-bf16-interleaved-rope", "state-reuse-after-finish"}) {
    INFO(name);
    const Recorded r = record_and_audit(bundled(name), impl::Fault::kNone);
    CHECK(r.live.passed);
    CHECK(r.live.observed == "slots+outputs");
    CHECK(r.note.empty());
    check_same(r, true);
    CHECK(stepped_rows(r.built) > 0);
    // The built scenario is a valid scenario file: it saves and loads back the same.
    CHECK(scenarios::parse_scenario(scenarios::save_scenario(r.built), "") == r.built);
  }
  // verify(3) at step 1 writes 5..8, accept 1, decodes rewrite 7 and 8 (steps 3,
  // 4); verify(3) at step 5 writes 9..12, accept 0, decodes rewrite 10 and 11
  // (steps 7, 8): two rows for each of 7, 8, 10, 11, one for each other position.
  const Recorded r = record_and_audit(bundled("verify-reject-then-decode"), impl::Fault::kNone);
  using Key = std::pair<std::int64_t, std::optional<std::int64_t>>;  // position, step
  std::vector<Key> keys;
  for (const auto& row : r.built.data.rows) keys.emplace_back(row.position, row.step);
  std::sort(keys.begin(), keys.end());
  const std::vector<Key> expected = {{0, {}}, {1, {}}, {2, {}}, {3, {}}, {4, {}}, {5, {}},
                                     {6, {}}, {7, 1},  {7, 3},  {8, 1},  {8, 4},  {9, {}},
                                     {10, 5}, {10, 7}, {11, 5}, {11, 8}, {12, {}}};
  CHECK(keys == expected);
}

TEST_CASE("Audit: recorded faulted runs with rewritten positions fail the same way, outputs judged") {
  const std::pair<const char*, impl::Fault> cases[] = {
      {"verify-reject-then-decode", impl::Fault::kWindowTooNarrow},
      {"verify-reject-then-decode", impl::Fault::kAcceptNoRollback},
      {"state-reuse-after-finish", impl::Fault::kSlotNoStateOffset},
      {"state-reuse-after-finish", impl::Fault::kWindowTooWide},
  };
  for (const auto& [name, fault] : cases) {
    INFO(name << " with " << impl::fault_name(fault));
    const Recorded r = record_and_audit(bundled(name), fault);
    CHECK_FALSE(r.live.passed);
    CHECK(r.audited.first_failure == r.live.first_failure);
    CHECK(stepped_rows(r.built) > 0);
    check_same(r, true);
  }
}

TEST_CASE("Audit: make_rows takes a row for the step, else an unstepped row, else the seed") {
  scenarios::Scenario sc = bundled("verify-reject-then-decode");
  const RowSet drawn = make_rows(sc, 0, 0, 5, 4, 1);  // verify at step 1: positions 5..8
  const auto row = [](std::int64_t position, std::optional<std::int64_t> step, double base) {
    scenarios::ExplicitRow r;
    r.request = 0;
    r.position = position;
    r.step = step;
    r.k = {base, base + 1, base + 2, base + 3};
    r.v = {-base, -base - 1, -base - 2, -base - 3};
    r.q = {base / 2, base / 4, base / 8, base / 16};
    return r;
  };
  sc.data.rows = {row(7, 3, 10), row(7, {}, 20), row(8, 4, 30), row(6, 1, 40)};
  scenarios::validate_scenario(sc);
  const RowSet verify = make_rows(sc, 0, 0, 5, 4, 1);
  const auto slice = [](const std::vector<double>& all, std::size_t i) {
    return std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(4 * i),
                               all.begin() + static_cast<std::ptrdiff_t>(4 * i + 4));
  };
  CHECK(slice(verify.k, 0) == slice(drawn.k, 0));  // 5: no row, the seed's
  CHECK(slice(verify.k, 1) == sc.data.rows[3].k);  // 6: the row for step 1
  CHECK(slice(verify.q, 1) == sc.data.rows[3].q);
  CHECK(slice(verify.k, 2) == sc.data.rows[1].k);  // 7: step 1 has none, the unstepped row
  CHECK(slice(verify.v, 2) == sc.data.rows[1].v);
  CHECK(slice(verify.k, 3) == slice(drawn.k, 3));  // 8: only a row for step 4
  CHECK(slice(verify.v, 3) == slice(drawn.v, 3));
  const RowSet decode7 = make_rows(sc, 0, 0, 7, 1, 3);
  CHECK(decode7.k == sc.data.rows[0].k);  // 7 at step 3: its own row
  CHECK(decode7.v == sc.data.rows[0].v);
  CHECK(decode7.q == sc.data.rows[0].q);
  const RowSet decode8 = make_rows(sc, 0, 0, 8, 1, 4);
  CHECK(decode8.k == sc.data.rows[2].k);
  CHECK(make_rows(sc, 0, 0, 6, 1, 2).k != sc.data.rows[3].k);  // 6 at another step: the seed's
}

TEST_CASE("Audit: refusal probes are not recorded") {
  const Recorded a = record_and_audit(bundled("verify-s134"), impl::Fault::kNone, /*probes=*/true);
  CHECK(a.live.passed);
  CHECK(a.live.probes > 0);
  check_same(a, true);
  const Recorded b =
      record_and_audit(bundled("state-reuse-after-finish"), impl::Fault::kNone, /*probes=*/true);
  CHECK(b.live.passed);
  CHECK(b.live.probes > 0);
  check_same(b, true);
}

TEST_CASE("Audit: a recorded refusal fails the run at that step") {
  const std::string text = lines({
      kHeader,
      R"({"step":0,"layer":0,"kind":"prefill","request":0,"state":0,"position":0,"rows":2,"order":"store_then_load","written":[0,1],"read":[[0],[0,1]]})",
      R"({"step":1,"layer":0,"kind":"decode","request":0,"state":0,"position":2,"refused":"full: no free block"})",
  });
  const auto audited = audit_trace(scenarios::parse_trace(text, ""), AuditOptions{});
  REQUIRE(audited.size() == 1);
  CHECK_FALSE(audited[0].passed);
  REQUIRE(audited[0].steps.size() == 2);
  CHECK(audited[0].steps[1].error == "full: no free block");
  // A refused begin ends the run before its step.
  const auto begun = audit_trace(
      scenarios::parse_trace(
          lines({kHeader,
                 R"({"step":0,"layer":0,"kind":"begin","request":4,"state":0,"refused":"state-busy"})"}),
          ""),
      AuditOptions{});
  CHECK_FALSE(begun[0].passed);
  CHECK(begun[0].first_failure.find("begin refused: state-busy") != std::string::npos);
}

TEST_CASE("Audit: a begin from a shared prefix: a prefix row read from its slot passes, evicted it is missing") {
  // Window 3. Request 0 writes positions 0 and 1 at slots 0, 1 and finishes;
  // request 1 begins from its first 2 positions and decodes at 2.
  const std::string r0 =
      R"({"step":0,"layer":0,"kind":"prefill","request":0,"state":0,"position":0,"rows":2,"order":"store_then_load","written":[0,1],"read":[[0],[0,1]]})";
  const std::string fin = R"({"step":1,"layer":0,"kind":"finish","request":0,"state":0})";
  const std::string begin = R"({"step":2,"layer":0,"kind":"begin","request":1,"state":0,"prefix":{"request":0,"positions":2}})";
  const std::string decode =
      R"({"step":2,"layer":0,"kind":"decode","request":1,"state":0,"position":2,"rows":1,"written":[5],"read":[[0,1,5]]})";
  const auto shared = audit_trace(scenarios::parse_trace(lines({kHeader, r0, fin, begin, decode}), ""), AuditOptions{});
  REQUIRE(shared.size() == 1);
  INFO(shared[0].first_failure);
  CHECK(shared[0].passed);
  // The finish freed slot 0 (evicted): position 0 is missing for the sharer.
  const std::string evicted = R"({"step":1,"layer":0,"kind":"finish","request":0,"state":0,"freed":[0]})";
  const auto gone = audit_trace(scenarios::parse_trace(lines({kHeader, r0, evicted, begin, decode}), ""), AuditOptions{});
  CHECK_FALSE(gone[0].passed);
  CHECK(gone[0].first_failure.find("missing [0]") != std::string::npos);
  // Stored again at the begin (written 7), and read there: passes.
  const std::string stored =
      R"({"step":2,"layer":0,"kind":"begin","request":1,"state":0,"prefix":{"request":0,"positions":2},"written":[7,-1]})";
  const std::string decode7 =
      R"({"step":2,"layer":0,"kind":"decode","request":1,"state":0,"position":2,"rows":1,"written":[5],"read":[[7,1,5]]})";
  CHECK(audit_trace(scenarios::parse_trace(lines({kHeader, r0, evicted, stored, decode7}), ""), AuditOptions{})[0].passed);
  // Written needs one slot per prefix position, and only a prefix begin has one.
  CHECK(parse_where(lines({kHeader, r0, fin,
                           R"({"step":2,"layer":0,"kind":"begin","request":1,"state":0,"prefix":{"request":0,"positions":2},"written":[7]})",
                           decode})) == "line 4: written");
  CHECK(parse_where(lines({kHeader, R"({"step":0,"layer":0,"kind":"begin","request":1,"state":0,"written":[7]})"})) ==
        "line 2: written");
}

TEST_CASE("Audit: cached slots in a trace keep their rows for a prefix begin until a write evicts them") {
  // Window 3. Request 0 writes positions 0 and 1 at slots 0, 1 and finishes,
  // its slots cached; request 1 begins from its first 2 positions.
  const std::string r0 =
      R"({"step":0,"layer":0,"kind":"prefill","request":0,"state":0,"position":0,"rows":2,"order":"store_then_load","written":[0,1],"read":[[0],[0,1]]})";
  const std::string fin = R"({"step":1,"layer":0,"kind":"finish","request":0,"state":0,"cached":[0,1]})";
  const auto begin = [](int step) {
    return R"({"step":)" + std::to_string(step) +
           R"(,"layer":0,"kind":"begin","request":1,"state":0,"prefix":{"request":0,"positions":2}})";
  };
  const auto decode = [](int step) {
    return R"({"step":)" + std::to_string(step) +
           R"(,"layer":0,"kind":"decode","request":1,"state":0,"position":2,"rows":1,"written":[5],"read":[[0,1,5]]})";
  };
  // Request 2 takes slot 1 (an eviction) and finishes.
  const std::string r2 =
      R"({"step":2,"layer":0,"kind":"decode","request":2,"state":0,"position":0,"rows":1,"written":[1],"read":[[1]]})";
  const std::string fin2 = R"({"step":3,"layer":0,"kind":"finish","request":2,"state":0,"freed":[1]})";
  const std::string r2_later = R"({"step":2,"layer":0,"kind":"begin","request":2,"state":0})";
  // Not evicted: the cached rows are read by the begin (a prefix hit).
  const auto hit = audit_trace(scenarios::parse_trace(lines({kHeader, r0, fin, begin(2), decode(2)}), ""), AuditOptions{});
  INFO(hit[0].first_failure);
  CHECK(hit[0].passed);
  CHECK(hit[0].steps.back().cached_rows == 0);  // held again by request 1
  const auto parsed = scenarios::parse_trace(lines({kHeader, r0, fin}), "");
  CHECK(parsed[0].steps[1].cached == std::vector<std::int64_t>{0, 1});
  CHECK(scenarios::trace_step_line(parsed[0].steps[1]).find(R"("cached":[0,1])") != std::string::npos);
  CHECK(parse_where(lines({kHeader, r0, R"({"step":1,"layer":0,"kind":"finish","request":0,"state":0,"cached":[-2]})"})) ==
        "line 3: cached[0]");
  // Evicted by request 2's write, then shared by the begin: position 1 is missing.
  const auto evicted =
      audit_trace(scenarios::parse_trace(lines({kHeader, r0, fin, r2_later, r2, fin2, begin(4), decode(4)}), ""), AuditOptions{});
  CHECK_FALSE(evicted[0].passed);
  CHECK(evicted[0].first_failure.find("missing [1]") != std::string::npos);
}

TEST_CASE("Audit: a trace whose schedule is invalid is rejected naming its line") {
  const std::string prefill =
      R"({"step":0,"layer":0,"kind":"prefill","request":0,"state":0,"position":0,"rows":2,"order":"store_then_load","written":[0,1],"read":[[0],[0,1]]})";
  // accept without a verify
  CHECK(audit_where(lines({kHeader, prefill,
                           R"({"step":1,"layer":0,"kind":"accept","request":0,"state":0,"accepted":0})"})) ==
        "line 3: kind");
  // accept of more drafts than the verify wrote
  CHECK(
      audit_where(lines(
          {kHeader, prefill,
           R"({"step":1,"layer":0,"kind":"verify","request":0,"state":0,"position":2,"drafts":1,"written":[2,3],"read":[[0,1,2],[1,2,3]]})",
           R"({"step":2,"layer":0,"kind":"accept","request":0,"state":0,"accepted":2})"})) ==
      "line 4: accepted");
  // a write at the wrong position
  CHECK(
      audit_where(lines(
          {kHeader, prefill,
           R"({"step":1,"layer":0,"kind":"decode","request":0,"state":0,"position":3,"written":[3],"read":[[1,2,3]]})"})) ==
      "line 3: position");
  // a second request on a state still held
  CHECK(
      audit_where(lines(
          {kHeader, prefill,
           R"({"step":1,"layer":0,"kind":"decode","request":1,"state":0,"position":0,"written":[5],"read":[[5]]})"})) ==
      "line 3: request");
  // a request that moves to another state
  CHECK(
      audit_where(lines(
          {kHeader, prefill,
           R"({"step":1,"layer":0,"kind":"decode","request":0,"state":1,"position":2,"written":[2],"read":[[0,1,2]]})"})) ==
      "line 3: state");
  // a step after the request finished
  CHECK(audit_where(lines({kHeader, prefill, R"({"step":1,"layer":0,"kind":"finish","request":0,"state":0})",
                           R"({"step":2,"layer":0,"kind":"finish","request":0,"state":0})"})) ==
        "line 4: request");
  // states beyond the header's
  CHECK(
      audit_where(lines(
          {R"({"kvcheck_trace":1,"name":"t","window":{"param":3,"convention":"keys"},"states":1,"addressing":"paged"})",
           R"({"step":0,"layer":0,"kind":"finish","request":0,"state":1})"})) == "line 2: state");
  CHECK(audit_where(lines({kHeader, prefill})) == "no error");
}

namespace {

// Records for kHeader (window 3), without their closing brace: request 0
// writes positions 0..2 at slots 0..2, then decodes 3 at slot 3.
const std::string kPrefill3 =
    R"({"step":0,"layer":0,"kind":"prefill","request":0,"state":0,"position":0,"rows":3,"order":"store_then_load","written":[0,1,2],"read":[[0],[0,1],[0,1,2]])";
const std::string kDecode3 =
    R"({"step":1,"layer":0,"kind":"decode","request":0,"state":0,"position":3,"written":[3],"read":[[1,2,3]])";

/// The audit of a one-run trace.
RunObservation audit(const std::string& text) {
  const auto runs = audit_trace(scenarios::parse_trace(text, ""), AuditOptions{});
  REQUIRE(runs.size() == 1);
  return runs[0];
}

}  // namespace

TEST_CASE("Audit: padding, moves and frees in a trace go through the shadow map, and read back exactly") {
  // Window 3. Request 0 writes positions 0..2 at slots 0..2, then decodes 3.
  const std::string prefill = kPrefill3;
  const std::string decode = kDecode3;
  // Padding at a scratch slot and freeing position 0 (out of the window after the decode): clean.
  const RunObservation clean = audit(lines({kHeader, prefill + R"(,"padded":[90]})", decode + R"(,"freed":[0]})"}));
  CHECK(clean.passed);
  // Padding over position 1 (written after the step's rows, before its
  // reads): overwritten for the queries at 1, 2 and 3.
  const RunObservation padded = audit(lines({kHeader, prefill + R"(,"padded":[1]})", decode + "}"}));
  CHECK_FALSE(padded.passed);
  CHECK(padded.lost_rows == 3);
  CHECK(padded.steps[0].queries[1].overwritten == std::vector<std::int64_t>{1});
  // Freeing position 2 with the decode: the next query (at 4) still sees it.
  const RunObservation freed = audit(lines({kHeader, prefill + "}", decode + R"(,"freed":[2]})"}));
  CHECK_FALSE(freed.passed);
  CHECK(freed.freed_visible == 1);
  CHECK_THAT(freed.first_failure, Catch::Contains("freed 1 rows still visible"));
  // A move of position 1 onto slot 2 drops position 2.
  const RunObservation moved = audit(lines({kHeader, prefill + "}", decode + R"(,"moved":[[1,2]]})"}));
  CHECK_FALSE(moved.passed);

  const auto parsed = scenarios::parse_trace(lines({kHeader, prefill + R"(,"padded":[7],"moved":[[1,5]],"freed":[4]})",
                                                    R"({"step":1,"layer":0,"kind":"finish","request":0,"state":0,"freed":[0,1]})"}),
                                             "");
  REQUIRE(parsed[0].steps.size() == 2);
  CHECK(parsed[0].steps[0].moved == std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 5}});
  CHECK(parsed[0].steps[1].freed == std::vector<std::int64_t>{0, 1});
  CHECK(scenarios::trace_step_line(parsed[0].steps[0]).find(R"("padded":[7],"moved":[[1,5]],"freed":[4])") !=
        std::string::npos);
  CHECK(parse_where(lines({kHeader, prefill + R"(,"moved":[[1]]})"})) == "line 2: moved[0]");
  CHECK(parse_where(lines({kHeader, prefill + R"(,"freed":[-1]})"})) == "line 2: freed[0]");
  CHECK(parse_where(lines({kHeader, R"({"step":0,"layer":0,"kind":"begin","request":0,"state":0,"freed":[-1]})"})) ==
        "line 2: freed[0]");
}

TEST_CASE("Audit: a begin record's frees are judged as a step's (a free of a visible row fails either way)") {
  // Window 3. Request 0 writes positions 0..2 at slots 0..2; request 1
  // begins on state 1 at step 1 and prefills one row at slot 10. Request 0's
  // next query (at 3) still sees positions 1 and 2, not 0.
  const std::string begin = R"({"step":1,"layer":0,"kind":"begin","request":1,"state":1)";
  const std::string prefill1 =
      R"({"step":1,"layer":0,"kind":"prefill","request":1,"state":1,"position":0,"rows":1,"order":"store_then_load","written":[10],"read":[[10]])";
  const std::string prefill0 = kPrefill3 + "}";
  // Freeing position 2 at the begin, or in the step it begins: both fail, the same row named.
  const RunObservation at_begin = audit(lines({kHeader, prefill0, begin + R"(,"freed":[2]})", prefill1 + "}"}));
  const RunObservation at_step = audit(lines({kHeader, prefill0, begin + "}", prefill1 + R"(,"freed":[2]})"}));
  for (const RunObservation* run : {&at_begin, &at_step}) {
    CHECK_FALSE(run->passed);
    CHECK(run->freed_visible == 1);
    CHECK_THAT(run->first_failure, Catch::StartsWith("step 1 (prefill) layer 0: freed 1 rows still visible; first: slot 2 "
                                                     "holding request 0 position 2"));
  }
  CHECK_THAT(at_begin.first_failure, Catch::EndsWith("(freed by the begin)"));
  REQUIRE(at_begin.steps.size() == 2);
  CHECK(at_begin.steps[1].freed_slots == 1);
  // Position 0 is out of request 0's window: freeing it at the begin is clean.
  const RunObservation clean = audit(lines({kHeader, prefill0, begin + R"(,"freed":[0]})", prefill1 + "}"}));
  CHECK(clean.passed);
  CHECK(clean.steps[1].freed_slots == 1);
  // A begin's padding is written as a step's: over position 1, overwritten for request 0's next query.
  const std::string decode0 =
      R"({"step":2,"layer":0,"kind":"decode","request":0,"state":0,"position":3,"written":[3],"read":[[1,2,3]]})";
  const RunObservation padded = audit(lines({kHeader, prefill0, begin + R"(,"padded":[1]})", prefill1 + "}", decode0}));
  CHECK_FALSE(padded.passed);
  CHECK(padded.lost_rows == 1);
}

TEST_CASE("Audit: a trace's resident bound is judged as check judges it, and read strictly") {
  // Window 3. Request 0 writes positions 0..2 at slots 0..2, then decodes 3 at slot 3.
  const std::string prefill = kPrefill3 + "}";
  const std::string decode = kDecode3;
  const auto header = [](const std::string& bound) {
    return R"({"kvcheck_trace":1,"name":"t","window":{"param":3,"convention":"keys"},"addressing":"paged","resident_bound":)" +
           bound + "}";
  };
  const std::string three = R"({"unit":"rows","per":"cache","limit":3})";
  // Without a bound the trace passes holding 4 rows; with 3 it fails at the
  // decode; freeing position 0 (out of the window) keeps it within.
  CHECK(audit(lines({kHeader, prefill, decode + "}"})).passed);
  const RunObservation over = audit(lines({header(three), prefill, decode + "}"}));
  CHECK_FALSE(over.passed);
  CHECK(over.steps_over_bound == 1);
  CHECK_THAT(over.first_failure, Catch::Contains("holds 4 rows in all, over its declared resident bound of 3"));
  const RunObservation within = audit(lines({header(three), prefill, decode + R"(,"freed":[0]})"}));
  INFO(within.first_failure);
  CHECK(within.passed);
  CHECK(within.steps_over_bound == 0);
  // Per request: 4 rows of request 0, bound 4, passes.
  CHECK(audit(lines({header(R"({"unit":"rows","per":"request","limit":4})"), prefill, decode + "}"})).passed);

  // Written back as read; traces without it keep their header bytes.
  const auto parsed = scenarios::parse_trace(lines({header(three), prefill}), "");
  REQUIRE(parsed[0].header.resident_bound.has_value());
  CHECK(parsed[0].header.resident_bound->limit == 3);
  CHECK(scenarios::trace_header_line(parsed[0].header).find(R"("resident_bound":{"unit":"rows","per":"cache","limit":3})") !=
        std::string::npos);
  CHECK(scenarios::trace_header_line(scenarios::parse_trace(lines({kHeader, prefill}), "")[0].header).find("resident") ==
        std::string::npos);

  // Malformed bounds are errors naming the field.
  CHECK(parse_where(lines({header(R"({"unit":"bytes","limit":3})"), prefill})) == "line 1: resident_bound.unit");
  CHECK(parse_where(lines({header(R"({"unit":"blocks","limit":3})"), prefill})) == "line 1: resident_bound.unit");
  CHECK(parse_where(lines({header(R"({"unit":"rows","per":"layer","limit":3})"), prefill})) ==
        "line 1: resident_bound.per");
  CHECK(parse_where(lines({header(R"({"unit":"rows","limit":0})"), prefill})) == "line 1: resident_bound.limit");
  CHECK(parse_where(lines({header(R"({"unit":"rows"})"), prefill})) == "line 1: resident_bound.limit");
  CHECK(parse_where(lines({header(R"({"unit":"rows","limit":3,"limits":3})"), prefill})) ==
        "line 1: resident_bound.limits");
  CHECK(parse_where(lines({header("4"), prefill})) == "line 1: resident_bound");
}

namespace {

/// The CPU ring pool declared bookkeeping-only (no outputs, as `"outputs":
/// false` declares): its answers' outputs are zeros, which kvcheck ignores.
class NoOutputs final : public engines::CacheUnderTest {
 public:
  explicit NoOutputs(std::unique_ptr<engines::CacheUnderTest> inner) : inner_(std::move(inner)) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    const engines::StepStatus st = inner_->call(c, answer);
    if (answer != nullptr) std::fill(answer->out.begin(), answer->out.end(), 0.0);
    return st;
  }

 private:
  std::unique_ptr<engines::CacheUnderTest> inner_;
};

/// The CPU ring pool with its capabilities changed by `declare`; declared
/// bookkeeping-only (computes_outputs false), its answers' outputs are zeros.
class DeclaredProvider final : public engines::CacheProvider {
 public:
  explicit DeclaredProvider(const std::function<void(engines::Capabilities&)>& declare)
      : inner_(engines::make_provider("cpu", "none")), caps_(inner_->capabilities()) {
    declare(caps_);
  }
  const engines::Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return "declared"; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec, engines::Refusal* refused) override {
    auto cache = inner_->open(spec, refused);
    if (!cache || caps_.computes_outputs) return cache;
    return std::make_unique<NoOutputs>(std::move(cache));
  }

 private:
  std::unique_ptr<engines::CacheProvider> inner_;
  engines::Capabilities caps_;
};

/// One request decoding 8 times on a ring of 5 rows, window 4.
scenarios::Scenario eight_decodes(const std::string& name) {
  scenarios::Scenario sc;
  sc.name = name;
  sc.cache.window = 4;
  sc.cache.ring_rows = 5;
  sc.cache.head_dim = 4;
  sc.requests = {{0, 0}};
  for (int i = 0; i < 8; ++i) {
    scenarios::Step d;
    d.kind = scenarios::StepKind::kDecode;
    sc.steps.push_back(d);
  }
  return sc;
}

/// A live run of `sc` through the recording provider, and its recording.
struct LiveRecording {
  RunObservation live;
  std::string trace;
};
LiveRecording record_live(std::unique_ptr<engines::CacheProvider> provider, const scenarios::Scenario& sc) {
  auto writer = std::make_shared<scenarios::TraceWriter>();
  auto recorder = engines::make_recording_provider(std::move(provider), writer, "unnamed");
  recorder->set_scenario(sc);
  RunOptions options;
  options.provider = recorder.get();
  LiveRecording r{run_scenario(sc, options), {}};
  writer->check();
  r.trace = writer->text();
  return r;
}

}  // namespace

TEST_CASE("Audit: the recording of a bookkeeping-only cache carries no outputs and audits on its slots") {
  // It computed no outputs: recording zeros as its outputs made the audit of
  // a passing run fail on every query.
  const LiveRecording r =
      record_live(std::make_unique<DeclaredProvider>([](engines::Capabilities& c) { c.computes_outputs = false; }),
                  eight_decodes("no-outputs"));
  INFO(r.live.first_failure);
  REQUIRE(r.live.passed);
  CHECK(r.trace.find("\"out\"") == std::string::npos);
  const auto runs = scenarios::parse_trace(r.trace, "recording");
  REQUIRE(runs.size() == 1);
  const auto audited = audit_trace(runs, AuditOptions{});
  REQUIRE(audited.size() == 1);
  INFO(audited.front().first_failure);
  CHECK(audited.front().passed);
  CHECK(audited.front().observed == "slots");
  CHECK(audited.front().queries == 8);
}

TEST_CASE("Audit: a recording carries the cache's resident bound and audits to the live verdict on it") {
  // A ring of 5 rows under 8 decodes holds 5 rows: within a bound of 5, over one of 4.
  for (const std::int64_t limit : {5, 4}) {
    const LiveRecording r = record_live(std::make_unique<DeclaredProvider>([limit](engines::Capabilities& c) {
                                          c.resident_bound.unit = engines::ResidentBound::Unit::kRows;
                                          c.resident_bound.limit = limit;
                                        }),
                                        eight_decodes("bounded"));
    CHECK(r.trace.find(R"("resident_bound":{"unit":"rows","per":"cache","limit":)" + std::to_string(limit) + "}") !=
          std::string::npos);
    const auto audited = audit_trace(scenarios::parse_trace(r.trace, "recording"), AuditOptions{});
    REQUIRE(audited.size() == 1);
    INFO("limit " << limit << ": " << r.live.first_failure << " / " << audited.front().first_failure);
    CHECK(r.live.passed == (limit == 5));
    CHECK(audited.front().passed == r.live.passed);
    CHECK(audited.front().steps_over_bound == r.live.steps_over_bound);
    CHECK(audited.front().first_failure == r.live.first_failure);
  }
}

TEST_CASE(
    "Audit: a preempt and the begin that resumes it (docs/semantics.md Preemption), stored again or not") {
  // Recorded from paged_cache.py --preempt and --bug preempt-stale-table on
  // the same schedule: decode, preempt (its block freed), then a prefill
  // after the begin from the request's own position 0. Stored again, the
  // read of position 0 is right; taken back from the freed block without
  // storing, position 0 is missing.
  const std::string stored =
      R"({"kvcheck_trace":1,"name":"counterexample-exec-seed1","window":{"param":2,"convention":"keys","keys":2},"capacity":7,"states":1,"addressing":"paged","block_size":4,"pool_blocks":3,"resident_bound":{"unit":"blocks","per":"request","limit":3},"cache":{"q_heads":1,"kv_heads":1,"head_dim":2,"shared_row":false,"format":"f64","rope":{"style":"none","rotary_dims":0,"base":10000.0},"layers":1,"softmax_scale":null,"sink_logit":null}}
{"step":0,"layer":0,"kind":"begin","request":0,"state":0}
{"step":0,"layer":0,"kind":"decode","request":0,"state":0,"position":0,"rows":1,"written":[0],"read":[[0]],"read_view":"after_writes","k":[[0.3300943374633789,-0.6865739822387695]],"v":[[0.9878807067871094,-0.726963996887207]],"q":[[0.6601972579956055,0.7369022369384766]],"out":[[0.9878807067871094,-0.726963996887207]]}
{"step":1,"layer":0,"kind":"preempt","request":0,"state":0,"freed":[0,1,2,3]}
{"step":2,"layer":0,"kind":"begin","request":0,"state":0,"prefix":{"request":0,"positions":1},"written":[0]}
{"step":2,"layer":0,"kind":"prefill","request":0,"state":0,"position":1,"rows":1,"order":"store_then_load","written":[1],"read":[[0,1]],"read_view":"after_writes","k":[[0.7293672561645508,0.4566049575805664]],"v":[[0.5653848648071289,-0.07171916961669922]],"q":[[0.3208770751953125,0.1852397918701172]],"out":[[0.7513695259525344,-0.36016103118881776]]})";
  const std::string stale =
      R"({"kvcheck_trace":1,"name":"counterexample-exec-seed1","window":{"param":2,"convention":"keys","keys":2},"capacity":7,"states":1,"addressing":"paged","block_size":4,"pool_blocks":3,"resident_bound":{"unit":"blocks","per":"request","limit":3},"cache":{"q_heads":1,"kv_heads":1,"head_dim":2,"shared_row":false,"format":"f64","rope":{"style":"none","rotary_dims":0,"base":10000.0},"layers":1,"softmax_scale":null,"sink_logit":null}}
{"step":0,"layer":0,"kind":"begin","request":0,"state":0}
{"step":0,"layer":0,"kind":"decode","request":0,"state":0,"position":0,"rows":1,"written":[0],"read":[[0]],"read_view":"after_writes","k":[[0.3300943374633789,-0.6865739822387695]],"v":[[0.9878807067871094,-0.726963996887207]],"q":[[0.6601972579956055,0.7369022369384766]],"out":[[0.9878807067871094,-0.726963996887207]]}
{"step":1,"layer":0,"kind":"preempt","request":0,"state":0,"freed":[0,1,2,3]}
{"step":2,"layer":0,"kind":"begin","request":0,"state":0,"prefix":{"request":0,"positions":1},"written":[-1]}
{"step":2,"layer":0,"kind":"prefill","request":0,"state":0,"position":1,"rows":1,"order":"store_then_load","written":[1],"read":[[0,1]],"read_view":"after_writes","k":[[0.7293672561645508,0.4566049575805664]],"v":[[0.5653848648071289,-0.07171916961669922]],"q":[[0.3208770751953125,0.1852397918701172]],"out":[[0.7513695259525344,-0.36016103118881776]]})";
  const auto good = audit_trace(scenarios::parse_trace(stored, ""), AuditOptions{});
  REQUIRE(good.size() == 1);
  INFO(good[0].first_failure);
  CHECK(good[0].passed);
  CHECK(good[0].resumes == 1);
  const auto bad = audit_trace(scenarios::parse_trace(stale, ""), AuditOptions{});
  REQUIRE(bad.size() == 1);
  CHECK_FALSE(bad[0].passed);
  CHECK(bad[0].first_failure.find("missing [0]") != std::string::npos);
}

namespace {

/// kHeader with `extra` keys (",\"k\":v,...") before its closing brace.
std::string header_with(const std::string& extra) {
  return kHeader.substr(0, kHeader.size() - 1) + extra + "}";
}

/// The error auditing `text` throws: its id (201 type, 204 value, 300 size) and where(), or "no error".
std::string audit_error(const std::string& text) {
  try {
    audit_trace(scenarios::parse_trace(text, ""), AuditOptions{});
  } catch (const Error& e) {
    return std::to_string(static_cast<int>(e.id())) + " " + e.where();
  }
  return "no error";
}

/// Sum over steps of the collisions over a row another layer still saw.
std::int64_t other_layer(const RunObservation& run) {
  std::int64_t n = 0;
  for (const auto& s : run.steps) n += s.collisions.other_layer;
  return n;
}

}  // namespace

TEST_CASE("Audit: a trace header's declarations are read strictly and written back only when made") {
  const std::string prefill = kPrefill3 + "}";
  const std::string made =
      R"(,"block_size":2,"shared_pool":true,"lookahead_slots":4,"free_deferral_steps":2,"output_format":"bf16")";
  const auto parsed = scenarios::parse_trace(lines({header_with(made), prefill}), "");
  const scenarios::TraceHeader& h = parsed[0].header;
  CHECK(h.shared_pool);
  CHECK(h.lookahead_slots == 4);
  CHECK(h.free_deferral_steps == std::optional<std::int64_t>(2));
  CHECK(h.output_format == OutputFormat::kBf16);
  CHECK(scenarios::trace_header_line(h).find(
            R"("shared_pool":true,"lookahead_slots":4,"free_deferral_steps":2,"output_format":"bf16")") !=
        std::string::npos);
  CHECK(scenarios::parse_trace(scenarios::trace_header_line(h) + "\n" + prefill + "\n", "")[0].header == h);
  // A deferral of 0 steps is a declaration too (frees due at once).
  CHECK(
      scenarios::trace_header_line(
          scenarios::parse_trace(lines({header_with(R"(,"free_deferral_steps":0)"), prefill}), "")[0].header)
          .find(R"("free_deferral_steps":0)") != std::string::npos);
  // Nothing declared: the header keeps its bytes.
  const std::string plain =
      scenarios::trace_header_line(scenarios::parse_trace(lines({kHeader, prefill}), "")[0].header);
  for (const char* key : {"shared_pool", "lookahead_slots", "free_deferral_steps", "output_format"})
    CHECK(plain.find(key) == std::string::npos);

  // Bad values: typed errors naming the field; a forged size is refused
  // before anything is sized by it.
  CHECK(audit_error(lines({header_with(R"(,"shared_pool":1)"), prefill})) == "201 line 1: shared_pool");
  CHECK(
      audit_error(lines(
          {R"({"kvcheck_trace":1,"name":"t","window":{"param":3,"convention":"keys"},"capacity":8,"addressing":"ring","shared_pool":true})",
           prefill})) == "204 line 1: shared_pool");
  CHECK(audit_error(lines({header_with(R"(,"block_size":2,"lookahead_slots":-1)"), prefill})) ==
        "204 line 1: lookahead_slots");
  CHECK(audit_error(lines({header_with(R"(,"block_size":2,"lookahead_slots":4611686018427387904)"),
                           prefill})) == "300 line 1: lookahead_slots");
  CHECK(audit_error(lines({header_with(R"(,"block_size":2,"lookahead_slots":65537)"), prefill})) ==
        "300 line 1: lookahead_slots");
  CHECK(audit_error(lines({header_with(R"(,"lookahead_slots":4)"), prefill})) ==
        "204 line 1: lookahead_slots");
  CHECK(audit_error(lines({header_with(R"(,"free_deferral_steps":-2)"), prefill})) ==
        "204 line 1: free_deferral_steps");
  CHECK(audit_error(lines({header_with(R"(,"free_deferral_steps":9223372036854775807)"), prefill})) ==
        "300 line 1: free_deferral_steps");
  CHECK(audit_error(lines({header_with(R"(,"free_deferral_steps":"2")"), prefill})) ==
        "201 line 1: free_deferral_steps");
  CHECK(audit_error(lines({header_with(R"(,"output_format":"bf8")"), prefill})) ==
        "204 line 1: output_format");
  CHECK(audit_error(lines({header_with(R"(,"output_format":"accumulation")"), prefill})) ==
        "204 line 1: output_format");
  // Lookahead slots are room in the pool audit derives (4 slots: 2 blocks
  // of 2); a recorded pool is the run's, and a slot outside it fails.
  const RunObservation without = audit(lines({header_with(R"(,"block_size":2)"), prefill}));
  const RunObservation with = audit(lines({header_with(R"(,"block_size":2,"lookahead_slots":4)"), prefill}));
  CHECK(with.passed);
  CHECK(with.pool_blocks == without.pool_blocks + 2);
  CHECK(audit(lines({header_with(R"(,"block_size":2,"pool_blocks":2)"), prefill})).passed);
  const RunObservation outside = audit(lines({header_with(R"(,"block_size":2,"pool_blocks":1)"), prefill}));
  CHECK_FALSE(outside.passed);
  CHECK(outside.pool_blocks == 1);
  CHECK_THAT(outside.first_failure, Catch::Contains("pool_blocks 1 x block_size 2"));
  // The largest declarations audit as any other (the pool they size is arithmetic, not memory).
  const RunObservation largest = audit(lines(
      {header_with(R"(,"block_size":2,"lookahead_slots":65536,"free_deferral_steps":65536)"), prefill}));
  INFO(largest.first_failure);
  CHECK(largest.passed);
  CHECK(largest.pool_blocks > 65536 / 2);
}

TEST_CASE("Audit: a trace's shared pool judges a write over a row another layer still sees, as check does") {
  // Two layers, window 3: layer 0 prefills positions 0..2 at slots 0..2;
  // layer 1 then writes its own rows at slots 0..2 (over layer 0's, in one
  // pool) or at 4..6.
  const std::string layer0 = kPrefill3 + "}";
  const auto layer1 = [](const std::string& slots, const std::string& reads) {
    return R"({"step":0,"layer":1,"kind":"prefill","request":0,"state":0,"position":0,"rows":3,"order":"store_then_load","written":)" +
           slots + R"(,"read":)" + reads + "}";
  };
  const std::string over = layer1("[0,1,2]", "[[0],[0,1],[0,1,2]]");
  const std::string apart = layer1("[4,5,6]", "[[4],[4,5],[4,5,6]]");
  const std::string shared = header_with(R"(,"shared_pool":true)");
  // Pools of their own: the same slot ids are different memory.
  CHECK(audit(lines({kHeader, layer0, over})).passed);
  const RunObservation collided = audit(lines({shared, layer0, over}));
  CHECK_FALSE(collided.passed);
  CHECK(other_layer(collided) == 2);  // positions 1 and 2: the next query (at 3) sees them, not 0
  CHECK_THAT(collided.first_failure, Catch::Contains("layer 1 wrote slot 1 holding request 0 position 1"));
  CHECK_THAT(collided.first_failure, Catch::Contains("which layer 0 still sees"));
  const RunObservation ok = audit(lines({shared, layer0, apart}));
  INFO(ok.first_failure);
  CHECK(ok.passed);
  CHECK(other_layer(ok) == 0);
}

TEST_CASE("Audit: a trace's free deferral fails a block held past it (late_frees), as check does") {
  // Window 3, one slot per block: after the prefill (0..2) position 0 has
  // left every window, after the decode at 3 position 1.
  const std::string prefill = kPrefill3 + "}";
  const std::string decode3 = kDecode3;
  const std::string decode4 =
      R"({"step":2,"layer":0,"kind":"decode","request":0,"state":0,"position":4,"written":[4],"read":[[2,3,4]])";
  const auto header = [](int steps) {
    return header_with(R"(,"free_deferral_steps":)" + std::to_string(steps));
  };
  const auto run = [&](const std::string& h, const std::string& free3, const std::string& free4) {
    return audit(lines({h, prefill, decode3 + free3 + "}", decode4 + free4 + "}"}));
  };
  // Nothing declared: rows kept past the window are not judged.
  CHECK(run(kHeader, "", "").passed);
  // One step: position 0 must be freed by the decode at 3, position 1 by the one at 4.
  const RunObservation kept = run(header(1), "", "");
  CHECK_FALSE(kept.passed);
  CHECK(kept.late_frees > 0);
  CHECK_THAT(kept.first_failure, Catch::StartsWith("step 1 (decode) layer 0:"));
  CHECK_THAT(kept.first_failure, Catch::Contains("slot 0 holding request 0 position 0"));
  const RunObservation on_time = run(header(1), R"(,"freed":[0])", R"(,"freed":[1])");
  INFO(on_time.first_failure);
  CHECK(on_time.passed);
  CHECK(on_time.late_frees == 0);
  // Each free one step later: late for a deferral of 1, within one of 2.
  CHECK_FALSE(run(header(1), "", R"(,"freed":[0])").passed);
  const RunObservation deferred = run(header(2), "", R"(,"freed":[0])");
  INFO(deferred.first_failure);
  CHECK(deferred.passed);
}

TEST_CASE("Audit: a trace's output format is in the tolerance and in which values an output may take") {
  // One decode reading only its own row: the output is its v exactly, in f64.
  const std::string header = header_with(R"(,"cache":{"head_dim":2})");
  const auto decode = [](const std::string& out) {
    return R"({"step":0,"layer":0,"kind":"decode","request":0,"state":0,"position":0,"written":[0],"read":[[0]],"k":[[0.5,0.25]],"v":[[0.1,0.3]],"q":[[1.0,0.5]],"out":[)" +
           out + "]}";
  };
  const std::string exact = decode("[0.1,0.3]");
  const std::string in_bf16 = decode("[0.10009765625,0.30078125]");  // v rounded to nearest bf16
  const auto bf16 = [&](const std::string& record) {
    return audit(lines({header_with(R"(,"cache":{"head_dim":2},"output_format":"bf16")"), record}));
  };
  CHECK(audit(lines({header, exact})).passed);
  // Outputs as accumulated (f64): a bf16 rounding is an error ...
  const RunObservation narrow = audit(lines({header, in_bf16}));
  CHECK_FALSE(narrow.passed);
  CHECK(narrow.output_failures == 1);
  // ... written in bf16 it is the declared rounding, and an output that is no bf16 value fails.
  const RunObservation declared = bf16(in_bf16);
  INFO(declared.first_failure);
  CHECK(declared.passed);
  CHECK(declared.output_format == "bf16");
  const RunObservation not_bf16 = bf16(exact);
  CHECK_FALSE(not_bf16.passed);
  CHECK_THAT(not_bf16.first_failure, Catch::Contains("bf16 values"));
}

TEST_CASE("Audit: a recording carries the cache's declarations and audits to the live verdict on them") {
  struct Case {
    const char* name;
    std::function<void(engines::Capabilities&)> declare;
    std::int32_t layers;
    const char* key;  // what the recording's header carries
    bool passes;      // the live verdict
  };
  const std::vector<Case> cases = {
      // The CPU ring (5 rows, window 4) frees nothing: a row that left the
      // window stays until the ring comes round, late for a deferral of 0,
      // in time for one of 2 ...
      {"deferral 0",
       [](engines::Capabilities& c) {
         c.reports_frees = true;
         c.free_deferral_steps = 0;
       },
       1, R"("free_deferral_steps":0)", false},
      {"deferral 2",
       [](engines::Capabilities& c) {
         c.reports_frees = true;
         c.free_deferral_steps = 2;
       },
       1, R"("free_deferral_steps":2)", true},
      // ... its layers' rings, declared one pool of opaque slots, write over each other ...
      {"shared pool",
       [](engines::Capabilities& c) {
         c.ring_addressing = false;
         c.slots_in_pool = false;
         c.shared_pool = true;
       },
       2, R"("shared_pool":true)", false},
      {"own pools",
       [](engines::Capabilities& c) {
         c.ring_addressing = false;
         c.slots_in_pool = false;
       },
       2, R"("addressing":"opaque")", true},
      // ... and its f64 outputs are no bf16 values, but f64 ones.
      {"bf16 outputs", [](engines::Capabilities& c) { c.output_format = OutputFormat::kBf16; }, 1,
       R"("output_format":"bf16")", false},
      {"f64 outputs", [](engines::Capabilities& c) { c.output_format = OutputFormat::kF64; }, 1,
       R"("output_format":"f64")", true},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    scenarios::Scenario sc = eight_decodes(c.name);
    sc.cache.layers = c.layers;
    const LiveRecording r = record_live(std::make_unique<DeclaredProvider>(c.declare), sc);
    CHECK(r.trace.find(c.key) != std::string::npos);
    const auto audited = audit_trace(scenarios::parse_trace(r.trace, "recording"), AuditOptions{});
    REQUIRE(audited.size() == 1);
    INFO(r.live.first_failure << " / " << audited.front().first_failure);
    CHECK(r.live.passed == c.passes);
    CHECK(audited.front().passed == r.live.passed);
    CHECK(audited.front().first_failure == r.live.first_failure);
    CHECK(audited.front().late_frees == r.live.late_frees);
    CHECK(other_layer(audited.front()) == other_layer(r.live));
    CHECK(audited.front().output_failures == r.live.output_failures);
  }
}
