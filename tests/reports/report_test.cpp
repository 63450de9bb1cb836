// Tests for reports/: JSON, text, JUnit and HTML writers on hand-built
// observations (the docs/semantics.md "Golden values" verify case at S = 128), and the atomic writer.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reports/report.hpp"
#include "reports/report_html.hpp"
#include "reports/report_json.hpp"
#include "reports/report_junit.hpp"
#include "reports/report_text.hpp"
#include "support/error.hpp"

namespace {

using kvcheck::properties::QueryObservation;
using kvcheck::properties::ReadTag;
using kvcheck::properties::RunObservation;
using kvcheck::properties::StepObservation;
using kvcheck::reports::Report;

// A check summary from its leading fields (the rest, counts and labels, default).
kvcheck::reports::CheckSummary summary_of(std::int64_t cases, std::int64_t failures,
                                          std::vector<kvcheck::reports::CoverageCount> coverage,
                                          const std::string& counterexample_file,
                                          const std::string& replay_command,
                                          std::uint64_t failing_case_seed) {
  kvcheck::reports::CheckSummary c;
  c.cases = cases;
  c.failures = failures;
  c.coverage = std::move(coverage);
  c.counterexample_file = counterexample_file;
  c.replay_command = replay_command;
  c.failing_case_seed = failing_case_seed;
  return c;
}

// The verdict fields the runner sets (reports only read them), set here the
// way the runner would for a run without expectations.
void settle(RunObservation& run) {
  run.first_failing_step = -1;
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    auto& step = run.steps[i];
    step.failed = step.collisions.total() > 0 || step.expectation_failed || !step.error.empty();
    for (auto& q : step.queries) {
      q.failed = !q.overwritten.empty() || !q.missing.empty() || !q.extra.empty() || !q.output_ok;
      step.failed = step.failed || q.failed;
    }
    if (step.failed && run.first_failing_step < 0) run.first_failing_step = static_cast<std::int64_t>(i);
  }
  if (run.first_failing_step >= 0) run.passed = false;
}

// Verify of six queries p..p+5 in a ring of S slots, W = 128 visible keys,
// all six rows stored before the reads (docs/semantics.md "Golden values"): with S = 128 the draft rows
// p+1..p+5 land on the slots of the oldest visible rows.
RunObservation verify_run(std::int64_t ring_rows, std::int64_t p, std::int64_t state = 0) {
  constexpr std::int64_t kWindow = 128;
  RunObservation run;
  run.scenario_name = "verify-s" + std::to_string(ring_rows);
  run.backend = "cpu";
  run.fault = "none";
  run.window_convention = "keys";
  run.window_keys = kWindow;
  run.ring_rows = ring_rows;
  run.format = "bf16";
  run.precision_bits = 113;

  StepObservation step;
  step.step = 1;
  step.kind = "verify";
  step.request = 7;
  step.state = state;
  step.first_position = p;
  const std::int64_t last = p + 5;
  step.ring_positions.assign(static_cast<std::size_t>(ring_rows), -1);
  for (std::int64_t pos = 0; pos <= last; ++pos)
    step.ring_positions[static_cast<std::size_t>(pos % ring_rows)] = pos;
  for (std::int64_t pos = p; pos <= last; ++pos)
    step.written_slots.push_back(state * ring_rows + pos % ring_rows);

  for (std::int64_t k = 0; k < 6; ++k) {
    QueryObservation q;
    q.position = p + k;
    q.visible_first = std::max<std::int64_t>(0, q.position - kWindow + 1);
    for (std::int64_t j = q.visible_first; j <= q.position; ++j) {
      const std::int64_t slot = j % ring_rows;
      const std::int64_t held = step.ring_positions[static_cast<std::size_t>(slot)];
      q.reads.push_back(ReadTag{state * ring_rows + slot, 7, held, static_cast<std::uint64_t>(held + 1)});
      if (held != j) q.overwritten.push_back(j);
    }
    q.abs_diff = 0.001 * static_cast<double>(q.overwritten.size());
    q.rel_diff = q.abs_diff / 2;
    q.eps_units = q.abs_diff / 0.0078125;
    q.quant_abs_diff = q.abs_diff + 0.002;
    q.tolerance = 0.0625;
    q.output_ok = true;
    run.lost_rows += static_cast<std::int64_t>(q.overwritten.size());
    run.max_abs_diff = std::max(run.max_abs_diff, q.abs_diff);
    run.max_eps_units = std::max(run.max_eps_units, q.eps_units);
    run.max_quant_abs_diff = std::max(run.max_quant_abs_diff, q.quant_abs_diff);
    ++run.queries;
    step.queries.push_back(std::move(q));
  }

  StepObservation prefill;
  prefill.step = 0;
  prefill.kind = "prefill";
  prefill.order = "store_then_load";
  prefill.request = 7;
  prefill.state = state;
  prefill.first_position = 0;
  prefill.ring_positions.assign(static_cast<std::size_t>(ring_rows), -1);
  for (std::int64_t pos = 0; pos < p; ++pos)
    prefill.ring_positions[static_cast<std::size_t>(pos % ring_rows)] = pos;

  run.steps.push_back(std::move(prefill));
  run.steps.push_back(std::move(step));
  run.passed = run.lost_rows == 0;
  if (!run.passed) run.first_failure = "step 1 (verify): query " + std::to_string(p) + " lost 5 visible rows";
  settle(run);
  return run;
}

Report verify_report() {
  Report report;
  report.context.seed = 42;
  report.context.command = "kvcheck run --scenario \"verify <S=128>\" --seed 42 & more";
  report.runs.push_back(verify_run(128, 200));
  report.runs.push_back(verify_run(134, 200, 2));
  return report;
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size()))
    ++n;
  return n;
}

// A small XML well-formedness check: tags balance, attributes are quoted and
// hold no raw '<', every '&' starts a known entity. Returns "" or the problem.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  std::size_t i = 0;
  if (xml.rfind("<?xml", 0) == 0) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    const char c = xml[i];
    if (c == '&') {
      const std::size_t semi = xml.find(';', i);
      if (semi == std::string::npos) return "bare &";
      const std::string entity = xml.substr(i, semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;") {
        return "unknown entity " + entity;
      }
      i = semi + 1;
    } else if (c == '>') {
      return "bare > in text at " + std::to_string(i);
    } else if (c == '<') {
      const std::size_t end = xml.find('>', i);
      if (end == std::string::npos) return "unterminated tag";
      std::string tag = xml.substr(i + 1, end - i - 1);
      // Attribute values must not contain '<' or a raw '"' (checked by quotes pairing).
      if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return "odd quotes in <" + tag + ">";
      if (tag.find('<') != std::string::npos) return "< inside tag";
      if (tag.front() == '/') {
        const std::string name = tag.substr(1);
        if (open.empty() || open.back() != name) return "unbalanced </" + name + ">";
        open.pop_back();
      } else if (tag.back() != '/') {
        open.push_back(tag.substr(0, tag.find_first_of(" \n")));
      }
      i = end + 1;
    } else {
      ++i;
    }
  }
  return open.empty() ? std::string() : "unclosed <" + open.back() + ">";
}

// The ring <svg> following `<section ... id="run-i"`.
std::string ring_svg_of(const std::string& html, std::size_t run) {
  const std::size_t section = html.find("id=\"run-" + std::to_string(run) + "\"");
  if (section == std::string::npos) return {};
  const std::size_t begin = html.find("<svg class=\"ring\"", section);
  const std::size_t end = html.find("</svg>", begin);
  return html.substr(begin, end - begin);
}

}  // namespace

TEST_CASE("Report: the verify fixture loses [5,4,3,2,1,0] rows at S = 128 and none at S = 134") {
  const Report report = verify_report();
  REQUIRE(kvcheck::reports::overwritten_counts(report.runs[0].steps[1]) == "[5,4,3,2,1,0]");
  REQUIRE(kvcheck::reports::overwritten_counts(report.runs[1].steps[1]) == "[0,0,0,0,0,0]");
  REQUIRE(report.runs[0].steps[1].queries[0].overwritten == std::vector<std::int64_t>{73, 74, 75, 76, 77});
  REQUIRE_FALSE(report.passed());
  REQUIRE(kvcheck::reports::first_failing_step(report.runs[0]) == 1);
  REQUIRE(kvcheck::reports::first_failing_step(report.runs[1]) == -1);
}

TEST_CASE("Report: verdict includes the property check and its coverage gates") {
  Report report;
  report.runs.push_back(verify_run(134, 200));
  REQUIRE(report.passed());
  report.check = kvcheck::reports::CheckSummary{};
  report.check->cases = 100;
  report.check->coverage.push_back({"ring wrap", 3, 1});
  REQUIRE(report.passed());
  report.check->coverage.push_back({"verify with rejection", 0, 1});
  REQUIRE_FALSE(report.passed());
  report.check->coverage.back().count = 1;
  report.check->failures = 1;
  REQUIRE_FALSE(report.passed());
}

TEST_CASE("Report: helpers truncate lists and print doubles shortest round-trip") {
  using kvcheck::reports::format_double;
  using kvcheck::reports::int_list;
  REQUIRE(int_list({}) == "[]");
  REQUIRE(int_list({5, 4, 3}) == "[5,4,3]");
  REQUIRE(int_list({1, 2, 3, 4, 5}, 2) == "[1,2,\u2026 (3 more)]");
  REQUIRE(format_double(0.1) == "0.1");
  REQUIRE(format_double(1e-300) == "1e-300");
  REQUIRE(format_double(0) == "0");
  REQUIRE(format_double(std::numeric_limits<double>::infinity()) == "inf");
}

TEST_CASE("JSON report: self-describing, carries every observed field, byte-identical, parses back") {
  const Report report = verify_report();
  const std::string text = kvcheck::reports::report_json_text(report);
  REQUIRE(text == kvcheck::reports::report_json_text(report));
  REQUIRE(text.back() == '\n');

  const auto j = nlohmann::json::parse(text);
  REQUIRE(j.at("report_version") == 1);
  REQUIRE(j.at("schema_version") == 1);
  REQUIRE(j.at("name").is_string());
  REQUIRE(j.at("description").get<std::string>().find("1 failed") != std::string::npos);
  REQUIRE(j.at("verdict") == "fail");
  REQUIRE(j.at("context").at("tool_version") == "0.1.0");
  REQUIRE(j.at("context").at("seed") == 42);
  REQUIRE(j.at("context").at("backend") == "cpu");
  REQUIRE(j.at("context").at("fault") == "none");
  REQUIRE(j.at("context").at("precision_bits") == 114);  // the default reference's real significand
  REQUIRE(j.at("context").at("precision_requested") == 113);
  REQUIRE(j.at("context").at("command") == report.context.command);
  REQUIRE(j.at("check").is_null());
  REQUIRE(j.at("summary").at("failed_runs") == 1);

  const auto& run = j.at("runs").at(0);
  REQUIRE(run.at("scenario") == "verify-s128");
  REQUIRE(run.at("window").at("convention") == "keys");
  REQUIRE(run.at("window").at("keys") == 128);
  REQUIRE(run.at("ring_rows") == 128);
  REQUIRE(run.at("format") == "bf16");
  REQUIRE(run.at("verdict") == "fail");
  REQUIRE(run.at("first_failing_step") == 1);
  REQUIRE(run.at("totals").at("lost_rows") == 15);
  REQUIRE(run.at("totals").at("queries") == 6);

  const auto& step = run.at("steps").at(1);
  REQUIRE(step.at("kind") == "verify");
  REQUIRE(step.at("overwritten_counts") == nlohmann::json::array({5, 4, 3, 2, 1, 0}));
  REQUIRE(step.at("collisions").at("same_step") == 0);
  REQUIRE(step.at("collisions").at("outside_block") == 0);
  REQUIRE(step.at("collisions").at("replaced_needed") == 0);
  REQUIRE(step.at("ring_positions").size() == 128);
  REQUIRE(run.at("steps").at(0).at("ring_positions").empty());  // passing step: omitted

  const auto& q = step.at("queries").at(0);
  REQUIRE(q.at("position") == 200);
  REQUIRE(q.at("visible").at("first") == 73);
  REQUIRE(q.at("visible").at("last") == 200);
  REQUIRE(q.at("overwritten") == nlohmann::json::array({73, 74, 75, 76, 77}));
  REQUIRE(q.at("missing").empty());
  REQUIRE(q.at("extra_reads").empty());
  REQUIRE(q.at("output").at("abs_diff").get<double>() == report.runs[0].steps[1].queries[0].abs_diff);
  REQUIRE(q.at("output").at("rel_diff").get<double>() == report.runs[0].steps[1].queries[0].rel_diff);
  REQUIRE(q.at("output").at("eps_units").get<double>() == report.runs[0].steps[1].queries[0].eps_units);
  REQUIRE(q.at("output").at("quant_abs_diff").get<double>() ==
          report.runs[0].steps[1].queries[0].quant_abs_diff);
  REQUIRE(q.at("output").at("tolerance") == 0.0625);

  REQUIRE(text.find("time") == std::string::npos);
  REQUIRE(j.at("runs").at(1).at("verdict") == "pass");
}

TEST_CASE("JSON report: non-finite output differences become null, collisions by kind, check block") {
  Report report = verify_report();
  auto& step = report.runs[0].steps[1];
  step.queries[2].abs_diff = std::numeric_limits<double>::quiet_NaN();
  step.collisions = {2, 1, 3};
  step.queries[1].extra.push_back(ReadTag{500, 9, 3, 11});
  report.check = summary_of(10, 1, {{"ring wrap", 4, 2}}, "cx.json", "kvcheck replay cx.json", 99);
  const auto j = nlohmann::json::parse(kvcheck::reports::report_json_text(report));
  const auto& s = j.at("runs").at(0).at("steps").at(1);
  REQUIRE(s.at("queries").at(2).at("output").at("abs_diff").is_null());
  REQUIRE(s.at("collisions").at("same_step") == 2);
  REQUIRE(s.at("collisions").at("outside_block") == 1);
  REQUIRE(s.at("collisions").at("replaced_needed") == 3);
  REQUIRE(s.at("collisions").at("total") == 6);
  REQUIRE(s.at("queries").at(1).at("extra_reads").at(0).at("slot") == 500);
  REQUIRE(j.at("check").at("failing_case_seed") == 99);
  REQUIRE(j.at("check").at("coverage").at(0).at("met") == true);
  REQUIRE(j.at("check").at("verdict") == "fail");
}

TEST_CASE("Text report: one line per run, the failing step's counts and lists, replay command") {
  Report report = verify_report();
  const std::string text = kvcheck::reports::report_text(report);
  REQUIRE(text == kvcheck::reports::report_text(report));
  REQUIRE(text.find("FAIL  verify-s128") != std::string::npos);
  REQUIRE(text.find("PASS  verify-s134") != std::string::npos);
  REQUIRE(text.find("[5,4,3,2,1,0]") != std::string::npos);
  REQUIRE(text.find("overwritten [73,74,75,76,77]") != std::string::npos);
  REQUIRE(text.find("eps") != std::string::npos);
  REQUIRE(text.find("replay: " + report.context.command) != std::string::npos);

  const std::string explanation = kvcheck::reports::run_explanation(report, report.runs[0]);
  REQUIRE(count(explanation, "\n") <= 25);
}

TEST_CASE("Text report: a long failure stays under 25 lines and truncates lists") {
  Report report = verify_report();
  auto& step = report.runs[0].steps[1];
  // 64 failing queries, each with 100 overwritten rows, plus collisions.
  QueryObservation q = step.queries[0];
  q.overwritten.clear();
  for (std::int64_t j = 0; j < 100; ++j) q.overwritten.push_back(j);
  step.queries.assign(64, q);
  step.collisions = {1, 0, 2};
  step.error = "CacheFull";
  settle(report.runs[0]);
  const std::string explanation = kvcheck::reports::run_explanation(report, report.runs[0]);
  REQUIRE(count(explanation, "\n") <= 25);
  REQUIRE(explanation.find("(88 more)") != std::string::npos);
  REQUIRE(explanation.find("(56 more queries)") != std::string::npos);
  REQUIRE(explanation.find("1 same-step, 0 outside block, 2 replaced") != std::string::npos);
}

TEST_CASE("JUnit report: well-formed, escaped, one testcase per run, failure count right") {
  Report report = verify_report();
  report.runs[0].scenario_name = "verify <S=128> & \"friends\" 'x'";
  report.runs[0].first_failure = "lost rows <5> & more";
  report.runs.push_back(verify_run(128, 300));
  report.runs.back().scenario_name = std::string("ctrl\x01") + "char";
  const std::string xml = kvcheck::reports::report_junit(report);
  REQUIRE(xml == kvcheck::reports::report_junit(report));
  INFO(xml);
  REQUIRE(xml_problem(xml).empty());
  REQUIRE(xml.find("<testsuites name=\"kvcheck\" tests=\"3\" failures=\"2\"") != std::string::npos);
  REQUIRE(xml.find("<testsuite name=\"kvcheck.cpu.none\" tests=\"3\" failures=\"2\"") != std::string::npos);
  REQUIRE(count(xml, "<testcase ") == 3);
  REQUIRE(count(xml, "<failure ") == 2);
  REQUIRE(xml.find("name=\"verify &lt;S=128&gt; &amp; &quot;friends&quot; &apos;x&apos;\"") !=
          std::string::npos);
  REQUIRE(xml.find("message=\"lost rows &lt;5&gt; &amp; more\"") != std::string::npos);
  REQUIRE(xml.find('\x01') == std::string::npos);
  REQUIRE(xml.find("[5,4,3,2,1,0]") != std::string::npos);

  report.check = summary_of(10, 0, {{"ring wrap", 0, 1}}, "", "", 0);
  const std::string with_check = kvcheck::reports::report_junit(report);
  REQUIRE(xml_problem(with_check).empty());
  REQUIRE(with_check.find("tests=\"4\" failures=\"3\"") != std::string::npos);
  REQUIRE(with_check.find("coverage below minimum") != std::string::npos);
}

TEST_CASE("HTML report: self-contained, one ring of S slots per failing run, bar chart, step table") {
  Report report = verify_report();
  report.runs.push_back(verify_run(17, 40, 3));  // S = 17: the window wraps the ring many times
  report.runs.back().scenario_name = "<script>alert(1)</script>";
  const std::string html = kvcheck::reports::report_html(report);
  REQUIRE(html == kvcheck::reports::report_html(report));
  REQUIRE(html.rfind("<!DOCTYPE html>", 0) == 0);
  REQUIRE(html.find("http") == std::string::npos);
  REQUIRE(html.find("<script") == std::string::npos);
  REQUIRE(html.find("&lt;script&gt;") != std::string::npos);
  REQUIRE(html.find("src=") == std::string::npos);

  // Runs 0 (S = 128) and 2 (S = 17) fail; run 1 passes and is not pictured.
  const std::string ring0 = ring_svg_of(html, 0);
  REQUIRE(count(ring0, "class=\"slot ") == 128);
  REQUIRE(count(ring0, "class=\"slot overwritten\"") == 5);  // query 200 lost 73..77
  REQUIRE(ring_svg_of(html, 1).empty());
  const std::string ring2 = ring_svg_of(html, 2);
  REQUIRE(count(ring2, "class=\"slot ") == 17);
  REQUIRE(count(html, "<svg class=\"ring\"") == 2);
  REQUIRE(count(html, "<svg class=\"bars\"") == 2);
  REQUIRE(count(html, "<svg") == count(html, "</svg>"));
  REQUIRE(html.find("<table class=\"steps\">") != std::string::npos);
  REQUIRE(html.find("[5,4,3,2,1,0]") != std::string::npos);
}

TEST_CASE("HTML report: a stale write of a visible row is drawn as overwritten") {
  Report report;
  report.runs.push_back(verify_run(134, 200));
  auto& q = report.runs[0].steps[1].queries[0];
  q.overwritten.push_back(150);  // read (r, 150) with an older write_seq
  settle(report.runs[0]);
  const std::string ring = ring_svg_of(kvcheck::reports::report_html(report), 0);
  REQUIRE(count(ring, "class=\"slot ") == 134);
  REQUIRE(count(ring, "class=\"slot overwritten\"") == 1);
  REQUIRE(ring.find("query needed position 150") != std::string::npos);
}

TEST_CASE("HTML report: with no failures the first runs are pictured") {
  Report report;
  for (int i = 0; i < 5; ++i) report.runs.push_back(verify_run(134, 200));
  const std::string html = kvcheck::reports::report_html(report);
  REQUIRE(count(html, "<svg class=\"ring\"") == 3);
  REQUIRE(count(ring_svg_of(html, 0), "class=\"slot ") == 134);
  REQUIRE(count(ring_svg_of(html, 0), "class=\"slot overwritten\"") == 0);
}

TEST_CASE("HTML report: a large ring is drawn as runs of slots") {
  Report report;
  report.runs.push_back(verify_run(2048, 3000));
  report.runs[0].passed = false;
  const std::string html = kvcheck::reports::report_html(report);
  REQUIRE(count(html, "class=\"slot ") == 0);
  REQUIRE(count(html, "class=\"slots ") >= 2);
}

TEST_CASE("Paged view: block tables and lifetimes from the written slots, and the lost row's block named") {
  // Blocks of 2 rows. Request 0 writes positions 0..3 to blocks 5, 3; request 1
  // then writes its positions 0..1 into block 5 (request 0's block 0 reused);
  // request 0's query at 4 reads slot 10 (block 5) for position 1, overwritten.
  RunObservation run;
  run.scenario_name = "paged";
  run.block_size = 2;
  run.pool_blocks = 6;
  run.passed = false;
  StepObservation a;
  a.step = 0;
  a.kind = "prefill";
  a.request = 0;
  a.first_position = 0;
  a.written_slots = {10, 11, 6, 7};
  StepObservation b;
  b.step = 1;
  b.kind = "prefill";
  b.request = 1;
  b.state = 1;
  b.first_position = 0;
  b.written_slots = {10, 11};
  StepObservation c;
  c.step = 2;
  c.kind = "decode";
  c.request = 0;
  c.first_position = 4;
  c.written_slots = {0};
  QueryObservation q;
  q.position = 4;
  q.visible_first = 1;
  q.overwritten = {1};
  q.failed = true;
  q.reads = {ReadTag{11, 1, 1, 6}, ReadTag{6, 0, 2, 3}, ReadTag{7, 0, 3, 4}, ReadTag{0, 0, 4, 7}};
  c.queries = {q};
  c.failed = true;
  run.steps = {a, b, c};
  run.first_failing_step = 2;
  run.first_failure = "step 2 (decode) layer 0 query 4: overwritten [1]";
  const auto view = kvcheck::reports::paged_view(run, 2);
  CHECK(view.blocks == 3);
  CHECK(view.reuses == 1);
  CHECK(view.reused_by_other == 1);
  REQUIRE(view.tables.size() == 2);
  CHECK(kvcheck::reports::block_table_text(view.tables[0]) == "[0:5 reused, 1:3, 2:0]");
  CHECK(kvcheck::reports::block_table_text(view.tables[1]) == "[0:5]");
  // A tenancy's last use is its request's last write or read there: block 3 was read at step 2, while
  // request 0's read of block 5 at step 2 is no use of a tenancy that ended at step 1.
  const auto* lost = kvcheck::reports::tenancy_of(view, run, 2, 0, 1);
  REQUIRE(lost != nullptr);
  CHECK(kvcheck::reports::tenancy_text(*lost) ==
        "block 5 (request 0's block 0): written at step 0, last used at step 0, reused by request 1 (its block 0) "
        "at step 1");
  CHECK(kvcheck::reports::tenancy_text(*kvcheck::reports::tenancy_of(view, run, 2, 0, 3)) ==
        "block 3 (request 0's block 1): written at step 0, last used at step 2, still held");
  // Request 0 takes block 5 back for position 0 at step 3: position 1, written at step 0 and lost
  // at step 1, is still told by the tenancy it was written in, not by the later one.
  StepObservation d;
  d.step = 3;
  d.kind = "decode";
  d.request = 0;
  d.first_position = 0;
  d.written_slots = {10};
  RunObservation again = run;
  again.steps.push_back(d);
  const auto later = kvcheck::reports::paged_view(again, 3);
  const auto* first_tenancy = kvcheck::reports::tenancy_of(later, again, 3, 0, 1);
  REQUIRE(first_tenancy != nullptr);
  CHECK(first_tenancy->first_written_step == 0);
  CHECK(first_tenancy->ended_step == 1);
  CHECK(kvcheck::reports::tenancy_of(later, again, 3, 0, 0)->first_written_step == 3);
  // Through step 0 nothing was reused yet; a ring run (block size 0) has no view.
  CHECK(kvcheck::reports::paged_view(run, 0).reuses == 0);
  RunObservation ring = run;
  ring.block_size = 0;
  CHECK(kvcheck::reports::paged_view(ring, 2).block_size == 0);
  // The text explains the lost row with its block's life.
  Report report;
  report.runs.push_back(run);
  const std::string text = kvcheck::reports::report_text(report);
  CHECK(text.find("  blocks of layer 0 through step 2 (B=2): 3 blocks written, 1 reuses (1 by another request)\n"
                  "  block table of request 0: [0:5 reused, 1:3, 2:0]\n"
                  "  position 1 lost: block 5 (request 0's block 0): written at step 0, last used at step 0, "
                  "reused by request 1 (its block 0) at step 1\n") != std::string::npos);
}

TEST_CASE("HTML report: a ring of capacity 2^40-1 draws what the run touched, not the capacity") {
  // Issue 30 item 6: a trace's capacity is a number in its header; the ring
  // used to be classified slot by slot (2^40 slots: out of memory, exit 3).
  constexpr std::int64_t kCapacity = (std::int64_t{1} << 40) - 1;
  Report report;
  RunObservation run;
  run.scenario_name = "huge-capacity";
  run.backend = "trace";
  run.fault = "none";
  run.window_convention = "keys";
  run.window_keys = 4;
  run.ring_rows = kCapacity;
  run.format = "f64";
  StepObservation step;
  step.step = 0;
  step.kind = "decode";
  step.request = 0;
  step.state = 0;
  step.first_position = 0;
  step.written_slots = {kCapacity - 1};
  QueryObservation q;
  q.position = 5;
  q.visible_first = 2;
  q.reads = {ReadTag{kCapacity - 1, 0, 5, 1}, ReadTag{7, 0, 1, 1}};
  q.extra = {ReadTag{7, 0, 1, 1}};
  q.overwritten = {4};
  q.output_ok = true;
  q.tolerance = 1;
  step.queries.push_back(q);
  run.steps.push_back(step);
  run.queries = 1;
  settle(run);
  run.passed = false;
  report.runs.push_back(run);
  const std::string html = kvcheck::reports::report_html(report);
  const std::string ring = ring_svg_of(html, 0);
  REQUIRE(ring.find("ring of 1099511627775 slots") != std::string::npos);
  REQUIRE(count(ring, "class=\"slot ") == 0);
  // Runs: empty 0..3, the overwritten slot 4, empty 5..6, the extra read at
  // 7, empty 8..2^40-3, the visible read at 2^40-2 (the last slot).
  REQUIRE(count(ring, "class=\"slots ") == 6);
  REQUIRE(count(ring, "class=\"slots overwritten\"") == 1);
  REQUIRE(count(ring, "class=\"slots extra\"") == 1);
  REQUIRE(count(ring, "class=\"slots visible\"") == 1);
  REQUIRE(ring.find("ring slots 8..1099511627773: empty") != std::string::npos);
  REQUIRE(html.size() < 200000);
}
