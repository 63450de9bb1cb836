// The four writers agree: text, JSON, JUnit and HTML of the same runs give
// the same counts, field by field. The runs are real: bundled regression
// scenarios replayed with their planted faults (a window one key too wide,
// whose wrong reads give an output error of ~1e15 eps; a freed state read
// again after a finish; a "left" window of 4 rows), and bundled scenarios
// that pass (two layers, finish and reset, fp8 rows). The JSON is parsed; the
// numbers are scraped from the text, the JUnit XML and the HTML.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "properties/agreement.hpp"
#include "properties/runner.hpp"
#include "reports/report.hpp"
#include "reports/report_html.hpp"
#include "reports/report_json.hpp"
#include "reports/report_junit.hpp"
#include "reports/report_text.hpp"
#include "reports/xml_escape.hpp"
#include "scenarios/scenario_json.hpp"

namespace {

using kvcheck::reports::Report;
using Json = nlohmann::json;

const std::string kSource = KVCHECK_SOURCE_DIR;

struct Replayed {
  std::string file;   // under scenarios/
  std::string fault;  // "none": as written
};

Report replay(const std::vector<Replayed>& list, std::vector<std::size_t>* scenario_steps) {
  Report report;
  report.context.command = "kvcheck replay (report agreement test)";
  for (const auto& r : list) {
    const auto sc = kvcheck::scenarios::load_scenario_file(kSource + "/scenarios/" + r.file);
    kvcheck::properties::RunOptions options;
    options.fault = r.fault;
    report.runs.push_back(kvcheck::properties::run_scenario(sc, options));
    scenario_steps->push_back(sc.steps.size());
  }
  return report;
}

std::string unescape(std::string s) {
  const std::pair<const char*, const char*> entities[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}, {"&amp;", "&"}};
  for (const auto& [from, to] : entities) {
    for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + 1))
      s.replace(at, std::string(from).size(), to);
  }
  return s;
}

// The text of an element with its tags removed.
std::string strip_tags(const std::string& html) {
  std::string out;
  bool in_tag = false;
  for (const char c : html) {
    if (c == '<') in_tag = true;
    if (!in_tag) out += c;
    if (c == '>') in_tag = false;
  }
  return unescape(out);
}

// The rows of the first <table class="NAME"> at or after `from`, each as its
// cells' text (header rows, with <th>, left out).
std::vector<std::vector<std::string>> table_rows(const std::string& html, const std::string& name,
                                                 std::size_t from = 0) {
  std::vector<std::vector<std::string>> rows;
  const std::size_t begin = html.find("<table class=\"" + name + "\">", from);
  REQUIRE(begin != std::string::npos);
  const std::size_t end = html.find("</table>", begin);
  std::size_t at = begin;
  while ((at = html.find("<tr", at)) != std::string::npos && at < end) {
    const std::size_t row_end = html.find("</tr>", at);
    const std::string row = html.substr(at, row_end - at);
    at = row_end;
    if (row.find("<th>") != std::string::npos) continue;
    std::vector<std::string> cells;
    for (std::size_t c = row.find("<td"); c != std::string::npos; c = row.find("<td", c + 1)) {
      const std::size_t open_end = row.find('>', c) + 1;
      cells.push_back(strip_tags(row.substr(open_end, row.find("</td>", open_end) - open_end)));
    }
    rows.push_back(cells);
  }
  return rows;
}

// "key=value" fields of a text summary line, and its first words.
std::map<std::string, std::string> line_fields(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream words(line);
  std::string w;
  words >> w;
  fields["verdict"] = w;
  words >> w;
  fields["name"] = w;
  while (words >> w) {
    const auto eq = w.find('=');
    if (eq == std::string::npos) {
      fields["format"] = w;  // the only bare word after the name
    } else {
      fields[w.substr(0, eq)] = w.substr(eq + 1);
    }
  }
  return fields;
}

std::string text_line(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if ((line.rfind("PASS  ", 0) == 0 || line.rfind("FAIL  ", 0) == 0) && line.find("  " + name + "  ") == 4)
      return line;
  }
  FAIL("no summary line for " << name);
  return {};
}

std::string last_line(const std::string& text) {
  const std::size_t end = text.find_last_not_of('\n');
  return text.substr(text.rfind('\n', end) + 1, end - text.rfind('\n', end));
}

std::string attribute(const std::string& xml, const std::string& element, const std::string& name) {
  const std::size_t at = xml.find("<" + element + " ");
  REQUIRE(at != std::string::npos);
  const std::size_t v = xml.find(" " + name + "=\"", at) + name.size() + 3;
  return xml.substr(v, xml.find('"', v) - v);
}

// Whether the JUnit test case named `name` holds a <failure>.
bool junit_failed(const std::string& xml, const std::string& name) {
  const std::size_t at = xml.find("<testcase classname=\"kvcheck.cpu.none\" name=\"" + name + "\"");
  REQUIRE(at != std::string::npos);
  const std::size_t end = xml.find('>', at);
  if (xml[end - 1] == '/') return false;
  return xml.find("<failure", end) < xml.find("</testcase>", end);
}

double number(const Json& j) { return j.is_null() ? std::numeric_limits<double>::infinity() : j.get<double>(); }

// Every number the four writers show for the runs of `report`, compared.
void cross_check(const Report& report, const std::vector<std::size_t>& scenario_steps) {
  const std::string text = kvcheck::reports::report_text(report);
  const Json json = Json::parse(kvcheck::reports::report_json_text(report));
  const std::string junit = kvcheck::reports::report_junit(report);
  const std::string html = kvcheck::reports::report_html(report);
  INFO(text);

  // The verdict and the run counts.
  const bool passed = json.at("verdict") == "pass";
  CHECK(passed == report.passed());
  CHECK(last_line(text).rfind(passed ? "PASS: " : "FAIL: ", 0) == 0);
  CHECK(html.find(std::string("<title>kvcheck report: ") + (passed ? "PASS" : "FAIL")) != std::string::npos);
  const Json& summary = json.at("summary");
  CHECK(std::stoll(attribute(junit, "testsuite", "tests")) == summary.at("runs").get<std::int64_t>());
  CHECK(std::stoll(attribute(junit, "testsuite", "failures")) == summary.at("failed_runs").get<std::int64_t>());
  CHECK(std::stoll(attribute(junit, "testsuite", "skipped")) ==
        summary.at("refused_runs").get<std::int64_t>() + summary.at("skipped_runs").get<std::int64_t>());
  CHECK(last_line(text).find(kvcheck::reports::run_counts_text(kvcheck::reports::run_counts(report))) !=
        std::string::npos);
  CHECK(html.find(kvcheck::reports::run_counts_text(kvcheck::reports::run_counts(report))) != std::string::npos);

  const auto html_runs = table_rows(html, "runs");
  REQUIRE(html_runs.size() == report.runs.size());
  std::size_t run_section = 0;
  for (std::size_t i = 0; i < report.runs.size(); ++i) {
    const Json& run = json.at("runs").at(i);
    const Json& totals = run.at("totals");
    const std::string name = run.at("scenario");
    INFO("run " << name);
    const bool run_failed = run.at("verdict") == "fail";

    // Text: the summary line.
    const auto t = line_fields(text_line(text, name));
    CHECK(t.at("verdict") == (run_failed ? "FAIL" : "PASS"));
    CHECK(t.at("S") == std::to_string(run.at("ring_rows").get<std::int64_t>()));
    const std::string window = std::to_string(run.at("window").at("parameter").get<std::int64_t>()) + "(" +
                               run.at("window").at("convention").get<std::string>() + ")";
    CHECK(t.at("W") == window);
    CHECK(t.at("format") == run.at("format"));
    for (const char* key : {"steps", "queries"}) CHECK(t.at(key) == std::to_string(totals.at(key).get<std::int64_t>()));
    CHECK(t.at("lost") == std::to_string(totals.at("lost_rows").get<std::int64_t>()));
    CHECK(t.at("extra") == std::to_string(totals.at("extra_reads").get<std::int64_t>()));
    CHECK(t.at("collisions") == std::to_string(totals.at("collisions").get<std::int64_t>()));
    CHECK(t.at("output_failures") == std::to_string(totals.at("output_failures").get<std::int64_t>()));
    CHECK(std::strtod(t.at("max_eps").c_str(), nullptr) == number(totals.at("max_eps_units")));
    const auto not_checked = totals.at("queries_not_output_checked").get<std::int64_t>();
    CHECK((not_checked == 0 ? "0" : t.at("not_output_checked")) == std::to_string(not_checked));

    // Steps: one definition. Every step of the scenario is observed (this
    // run went to the end): the terminal's "N steps" is the reports' steps.
    CHECK(totals.at("steps").get<std::size_t>() == scenario_steps[i]);
    std::set<std::int64_t> step_indices;
    std::int64_t output_failures = 0;
    for (const Json& s : run.at("steps")) {
      step_indices.insert(s.at("step").get<std::int64_t>());
      for (const Json& q : s.at("queries")) output_failures += q.at("output").at("ok").get<bool>() ? 0 : 1;
    }
    CHECK(static_cast<std::int64_t>(step_indices.size()) == totals.at("steps").get<std::int64_t>());
    CHECK(output_failures == totals.at("output_failures").get<std::int64_t>());

    // HTML: the runs table row.
    const auto& h = html_runs[i];
    REQUIRE(h.size() == 15);
    CHECK(h[0] == (run_failed ? "FAIL" : "PASS"));
    CHECK(h[1] == name);
    CHECK(h[4] == std::to_string(run.at("window").at("parameter").get<std::int64_t>()) + " " +
                      run.at("window").at("convention").get<std::string>());
    CHECK(h[5] == t.at("S"));
    CHECK(h[6] == t.at("format"));
    CHECK(h[7] == t.at("steps"));
    CHECK(h[8] == t.at("queries"));
    CHECK(h[9] == t.at("lost"));
    CHECK(h[10] == t.at("extra"));
    CHECK(h[11] == t.at("collisions"));
    CHECK(h[12] == t.at("output_failures"));
    CHECK(h[13] == t.at("max_eps"));
    CHECK(h[14] == run.at("first_failure"));

    // JUnit: the run's test case.
    CHECK(junit_failed(junit, name) == run_failed);

    // The HTML step table of a pictured run lists every observation the JSON
    // has, every step kind included (finish and reset too), and no step's
    // largest output error exceeds the run's (both over the queries that
    // read their rows correctly).
    const std::size_t section = html.find("<section class=\"run\" id=\"run-" + std::to_string(i) + "\"");
    if (section != std::string::npos) {
      ++run_section;
      const auto steps = table_rows(html, "steps", section);
      REQUIRE(steps.size() == run.at("steps").size());
      for (std::size_t k = 0; k < steps.size(); ++k) {
        const Json& s = run.at("steps").at(k);
        CHECK(steps[k][0] == std::to_string(s.at("step").get<std::int64_t>()));
        CHECK(steps[k][1].rfind(s.at("kind").get<std::string>(), 0) == 0);
        CHECK(steps[k][6] == std::to_string(s.at("queries").size()));
        if (!steps[k][11].empty() && steps[k][11] != "not judged")
          CHECK(std::strtod(steps[k][11].c_str(), nullptr) <= number(totals.at("max_eps_units")));
      }
    }

    // The text's explanation of a failing run: its step's largest output
    // error is no larger than the run's, and f64 rows show no quantization.
    if (run_failed) {
      const std::size_t at = text.find("\nFAIL " + name + " (");
      REQUIRE(at != std::string::npos);
      const std::string explanation = text.substr(at, text.find("  seed: ", at) - at);
      const std::size_t m = explanation.find("max output error in step: ");
      if (m != std::string::npos) {
        CHECK(std::strtod(explanation.c_str() + m + 26, nullptr) <= number(totals.at("max_eps_units")));
      }
      if (run.at("format") == "f64") CHECK(explanation.find("quantization") == std::string::npos);
      CHECK((explanation.find("eps > tolerance") != std::string::npos) ==
            (totals.at("output_failures").get<std::int64_t>() > 0));
    }
  }
  CHECK(run_section > 0);
}

}  // namespace

TEST_CASE("Reports agree: text, JSON, JUnit and HTML of replayed planted faults give the same counts") {
  std::vector<std::size_t> steps;
  const Report report = replay({{"regressions/fault-window-too-wide.json", "window-too-wide"},
                                {"regressions/fault-freed-state-readable.json", "freed-state-readable"},
                                {"regressions/fault-slot-no-state-offset.json", "slot-no-state-offset"},
                                {"fast/state-reuse-after-finish.json", "none"}},
                               &steps);
  REQUIRE_FALSE(report.passed());
  cross_check(report, steps);

  // The contradictions this holds, on the runs themselves.
  const auto& wide = report.runs[0];
  REQUIRE_FALSE(wide.passed);
  CHECK(wide.output_failures == 0);  // the wrong reads fail it, not the output
  const auto& bad = wide.steps[static_cast<std::size_t>(wide.first_failing_step)];
  const auto counts = kvcheck::reports::step_counts(bad);
  CHECK(counts.wrong_reads > 0);
  CHECK(counts.max_eps_units <= wide.max_eps_units);
  bool huge = false;  // the wrong rows' error is there, per query, and judged nowhere
  for (const auto& q : bad.queries) huge = huge || q.eps_units > 1e12;
  CHECK(huge);
  const std::string text = kvcheck::reports::report_text(report);
  CHECK(text.find("queries read wrong rows: their output error is not judged") != std::string::npos);
  // freed-state-readable: the finish that frees the state is in the reports.
  const auto& freed = report.runs[1];
  CHECK(std::any_of(freed.steps.begin(), freed.steps.end(), [](const auto& s) { return s.kind == "finish"; }));
  CHECK(report.runs[2].window == 4);
  CHECK(report.runs[2].window_keys == 5);
  CHECK(text.find(" W=4(left) ") != std::string::npos);
}

TEST_CASE("Reports agree: text, JSON, JUnit and HTML of passing runs, two layers, finish and reset") {
  std::vector<std::size_t> steps;
  const Report report = replay({{"fast/gqa-bf16-interleaved-rope.json", "none"},
                                {"fast/state-reuse-after-finish.json", "none"},
                                {"fast/fp8-shared-row-neox.json", "none"}},
                               &steps);
  REQUIRE(report.passed());
  cross_check(report, steps);
  // Every step kind of the scenario appears in the step table (pictured: the
  // first three runs when none failed).
  const std::string html = kvcheck::reports::report_html(report);
  const auto rows = table_rows(html, "steps", html.find("id=\"run-1\""));
  std::set<std::string> kinds;
  for (const auto& r : rows) kinds.insert(r[1].substr(0, r[1].find(' ')));  // "prefill store_then_load"
  CHECK(kinds == std::set<std::string>{"prefill", "decode", "finish", "reset"});
  CHECK(report.runs[0].steps.size() == 2 * steps[0]);  // two layers: two observations per step
}

TEST_CASE("Reports agree: a command of parts says in every format what it showed, a missed planted fault fails") {
  std::vector<std::size_t> steps;
  Report audit_like = replay({{"regressions/fault-freed-state-readable.json", "freed-state-readable"}}, &steps);
  audit_like.context.command = "kvcheck replay scenarios/regressions/fault-freed-state-readable.json";

  Report report;
  report.context.command = "kvcheck demo";
  kvcheck::reports::ReportPart fine;
  fine.title = "1. A part that passes";
  fine.text = "a table <of> values\n";
  report.parts.push_back(fine);
  kvcheck::reports::ReportPart planted;
  planted.title = "2. A planted fault";
  planted.planted_fault = true;
  planted.context = audit_like.context;
  planted.runs = audit_like.runs;
  planted.failed = !kvcheck::reports::part_report(planted).passed();
  planted.text = kvcheck::reports::report_text(kvcheck::reports::part_report(planted));
  report.parts.push_back(planted);

  for (const bool caught : {true, false}) {
    INFO("planted fault caught: " << caught);
    report.parts[1].failed = caught;
    const std::string text = kvcheck::reports::report_text(report);
    const Json json = Json::parse(kvcheck::reports::report_json_text(report));
    const std::string junit = kvcheck::reports::report_junit(report);
    const std::string html = kvcheck::reports::report_html(report);
    const std::string counts = caught ? "2 parts: 2 showed what they should; 1 of 1 planted faults caught"
                                      : "2 parts: 1 showed what they should; 0 of 1 planted faults caught";
    CHECK(last_line(text) == std::string(caught ? "PASS: " : "FAIL: ") + counts);
    CHECK(json.at("verdict") == (caught ? "pass" : "fail"));
    CHECK(json.at("summary").at("parts_as_meant") == (caught ? 2 : 1));
    CHECK(json.at("summary").at("planted_faults_caught") == (caught ? 1 : 0));
    CHECK(json.at("parts").at(1).at("verdict") == (caught ? "CAUGHT" : "MISSED"));
    CHECK(attribute(junit, "testsuite", "failures") == (caught ? "0" : "1"));
    CHECK(junit_failed(junit, "2. A planted fault") == !caught);
    CHECK_FALSE(junit_failed(junit, "1. A part that passes"));
    CHECK(html.find(std::string("<title>kvcheck report: ") + (caught ? "PASS" : "FAIL")) != std::string::npos);
    CHECK(html.find(caught ? ">CAUGHT</span> 2. A planted fault" : ">MISSED</span> 2. A planted fault") !=
          std::string::npos);
    CHECK(html.find(counts) != std::string::npos);
    // Every part the terminal printed is in the HTML: its title and its text.
    for (const auto& part : report.parts) {
      CHECK(html.find(part.title) != std::string::npos);
      CHECK(text.find("== " + part.title + " ==\n" + part.text) != std::string::npos);
    }
    CHECK(html.find("a table &lt;of&gt; values") != std::string::npos);
    // The planted part's failing run is pictured, and its replay is its own command.
    CHECK(html.find("id=\"part-1-run-0\"") != std::string::npos);
    CHECK(text.find("replay: " + audit_like.context.command) != std::string::npos);
    CHECK(text.find("replay: kvcheck demo") == std::string::npos);
  }
}

namespace {

// A paged cache in another process: the bundled adapter (blocks of 4 rows)
// with `flags` (e.g. "--prefix-cache") and `bug`, if any.
kvcheck::properties::RunObservation run_paged(const std::string& scenario_json, const std::string& bug,
                                              const std::string& flags = "") {
  const auto sc = kvcheck::scenarios::parse_scenario(scenario_json, "paged scenario");
  kvcheck::properties::RunOptions options;
  options.backend = "exec:/usr/bin/python3 " + kSource + "/adapters/paged_cache.py --block-size 4" +
                    (flags.empty() ? std::string() : " " + flags) + (bug.empty() ? std::string() : " --bug " + bug);
  return kvcheck::properties::run_scenario(sc, options);
}

// A run that freed a visible row names, in its first failure, the slot and
// the (request, position) it held; that slot is where the JSON's steps say
// the row was last written (a shared prefix's row: its source's write).
void check_freed_detail(const Report& report) {
  const Json json = Json::parse(kvcheck::reports::report_json_text(report));
  const Json& run = json.at("runs").at(0);
  const Json* freeing = nullptr;
  for (const Json& step : run.at("steps")) {
    if (step.contains("resident") && step.at("resident").at("freed_visible").get<std::int64_t>() > 0) {
      freeing = &step;
      break;
    }
  }
  REQUIRE(freeing != nullptr);
  const std::string detail = freeing->at("resident").at("freed_detail");
  INFO(detail);
  long long slot = -1, request = -1, position = -1;
  REQUIRE(std::sscanf(detail.c_str(), "slot %lld holding request %lld position %lld", &slot, &request, &position) == 3);
  CHECK(run.at("first_failure").get<std::string>().find("rows still visible; first: " + detail) != std::string::npos);
  long long last_slot = -1;
  for (const Json& step : run.at("steps")) {
    if (&step == freeing) break;  // the row was written before the step that freed it
    if (step.at("request") != request || step.at("layer") != freeing->at("layer")) continue;
    const long long at = position - step.at("first_position").get<long long>();
    const Json& written = step.at("written_slots");
    if (at >= 0 && at < static_cast<long long>(written.size()))
      last_slot = written.at(static_cast<std::size_t>(at)).get<long long>();
  }
  CHECK(last_slot == slot);
}

// The shrunk counterexample of `check --profile prefix` on paged_cache.py
// --prefix-cache --bug cow-skipped (seed 1): request 0 begins from request
// 1's first 5 positions; its first write goes into the shared block in
// place, and request 1's next write there overwrites request 0's row 5.
const char* const kPrefixScenario = R"({"schema_version": 1, "name": "prefix", "description": "",
  "cache": {"window": 5, "window_convention": "keys", "ring_rows": 7, "states": 3, "q_heads": 1, "kv_heads": 1,
            "head_dim": 2, "format": "f64", "layers": 1},
  "data": {"seed": 5349745935428482834, "rows": []},
  "requests": [{"id": 0, "state": 2, "prefix": {"request": 1, "positions": 5}}, {"id": 1, "state": 0}],
  "steps": [{"kind": "decode", "request": 1}, {"kind": "prefill", "request": 1, "rows": 3, "order": "store_then_load"},
            {"kind": "decode", "request": 1}, {"kind": "prefill", "request": 0, "rows": 1, "order": "store_then_load"},
            {"kind": "prefill", "request": 1, "rows": 1, "order": "store_then_load"},
            {"kind": "verify", "request": 0, "drafts": 0}]})";

std::string paged_scenario(const std::string& requests, const std::string& steps) {
  return R"({"schema_version": 1, "name": "paged", "description": "",
    "cache": {"window": 4, "window_convention": "keys", "ring_rows": 4, "states": 2, "q_heads": 1, "kv_heads": 1,
              "head_dim": 2, "format": "f64", "layers": 1},
    "data": {"seed": 7, "rows": []}, "requests": [)" +
         requests + R"(], "steps": [)" + steps + "]}";
}

// The block counts, tables and lifetimes of every paged run, as the JSON,
// the text (and with it JUnit's failure body) and the HTML give them.
void paged_cross_check(const Report& report) {
  const std::string text = kvcheck::reports::report_text(report);
  const Json json = Json::parse(kvcheck::reports::report_json_text(report));
  const std::string junit = kvcheck::reports::report_junit(report);
  const std::string html = kvcheck::reports::report_html(report);
  INFO(text);
  for (std::size_t i = 0; i < report.runs.size(); ++i) {
    const Json& run = json.at("runs").at(i);
    REQUIRE(run.contains("paged"));
    const Json& paged = run.at("paged");
    const std::string counts = std::to_string(paged.at("blocks").get<std::int64_t>()) + " blocks written, " +
                               std::to_string(paged.at("reuses").get<std::int64_t>()) + " reuses (" +
                               std::to_string(paged.at("reused_by_other_request").get<std::int64_t>()) +
                               " by another request)";
    // The block table of one request as the text writes it.
    const auto table_text = [&](std::int64_t request) {
      std::string out;
      for (const Json& t : paged.at("block_tables")) {
        if (t.at("request") != request) continue;
        for (const Json& e : t.at("blocks")) {
          out += (out.empty() ? "" : ", ") + std::to_string(e.at("logical").get<std::int64_t>()) + ":" +
                 std::to_string(e.at("physical").get<std::int64_t>()) + (e.at("held").get<bool>() ? "" : " reused");
        }
      }
      return "[" + out + "]";
    };
    const std::int64_t through = paged.at("through_step");
    const std::size_t section = html.find("<section class=\"run\" id=\"run-" + std::to_string(i) + "\"");
    if (section != std::string::npos) {
      // HTML: the counts, every request's table (logical -> physical, x when written again) and every lifetime.
      CHECK(html.find(counts, section) != std::string::npos);
      CHECK(html.find("after step " + std::to_string(through) + " (", section) != std::string::npos);
      const auto tables = table_rows(html, "block-tables", section);
      REQUIRE(tables.size() == paged.at("block_tables").size());
      for (std::size_t t = 0; t < tables.size(); ++t) {
        const Json& jt = paged.at("block_tables").at(t);
        std::string cells;
        for (const Json& e : jt.at("blocks")) {
          cells += std::to_string(e.at("logical").get<std::int64_t>()) + "\u2192" +
                   std::to_string(e.at("physical").get<std::int64_t>()) + (e.at("held").get<bool>() ? "" : "\u00d7") +
                   " ";
        }
        CHECK(tables[t][0] == std::to_string(jt.at("request").get<std::int64_t>()));
        CHECK(tables[t][1] == cells);
      }
      const auto lifetimes = table_rows(html, "block-lifetimes", section);
      REQUIRE(lifetimes.size() == paged.at("block_lifetimes").size());
      for (std::size_t k = 0; k < lifetimes.size(); ++k) {
        const Json& l = paged.at("block_lifetimes").at(k);
        CHECK(lifetimes[k][0] == std::to_string(l.at("block").get<std::int64_t>()));
        CHECK(lifetimes[k][1] == std::to_string(l.at("request").get<std::int64_t>()));
        CHECK(lifetimes[k][2] == std::to_string(l.at("logical").get<std::int64_t>()));
        CHECK(lifetimes[k][3] == std::to_string(l.at("first_written_step").get<std::int64_t>()));
        CHECK(lifetimes[k][4] == std::to_string(l.at("last_used_step").get<std::int64_t>()));
        const std::int64_t ended = l.at("ended_step");
        CHECK(lifetimes[k][5] == (ended < 0 ? std::string("still held")
                                            : "step " + std::to_string(ended) + ": request " +
                                                  std::to_string(l.at("next_request").get<std::int64_t>()) +
                                                  "'s block " +
                                                  std::to_string(l.at("next_logical").get<std::int64_t>())));
      }
      // A paged cache has no ring to draw.
      CHECK(html.find("<svg class=\"ring\"", section) > html.find("</section>", section));
    }
    if (run.at("verdict") == "fail") {
      // Text (and JUnit's failure, which carries it): counts and the failing request's table.
      const Json& step = run.at("steps").at(run.at("first_failing_step").get<std::size_t>());
      CHECK(through == step.at("step").get<std::int64_t>());
      const std::string head = "  blocks of layer " + std::to_string(paged.at("layer").get<std::int64_t>()) +
                               " through step " + std::to_string(through) +
                               " (B=" + std::to_string(paged.at("block_size").get<std::int64_t>()) + "): " + counts;
      const std::int64_t request = step.at("request");
      const std::string table =
          "  block table of request " + std::to_string(request) + ": " + table_text(request);
      CHECK(text.find(head + "\n" + table + "\n") != std::string::npos);
      CHECK(junit.find(kvcheck::reports::detail::xml_escape(head)) != std::string::npos);
      CHECK(junit.find(kvcheck::reports::detail::xml_escape(table)) != std::string::npos);
    }
    // The summary line names the block size and the pool.
    const auto t = line_fields(text_line(text, run.at("scenario")));
    CHECK(t.at("block_size") == std::to_string(paged.at("block_size").get<std::int64_t>()));
    CHECK(t.at("pool_blocks") == std::to_string(paged.at("pool_blocks").get<std::int64_t>()));
  }
}

}  // namespace

TEST_CASE("Reports agree: a paged cache's block tables and block lifetimes, in every format, and no ring") {
  // Request 0 fills two blocks and its window frees the first; request 1
  // takes it (the adapter's free list is LIFO): a block reused by another
  // request. Then both decode on.
  const std::string reuse = paged_scenario(
      R"({"id": 0, "state": 0}, {"id": 1, "state": 1})",
      R"({"kind": "prefill", "request": 0, "rows": 8, "order": "load_then_store"},
         {"kind": "prefill", "request": 1, "rows": 3, "order": "store_then_load"},
         {"kind": "decode", "request": 0}, {"kind": "decode", "request": 1},
         {"kind": "decode", "request": 0}, {"kind": "decode", "request": 1})");
  Report good;
  good.context.command = "kvcheck replay (report agreement test, paged)";
  good.runs.push_back(run_paged(reuse, ""));
  REQUIRE(good.passed());
  const Json json = Json::parse(kvcheck::reports::report_json_text(good));
  const Json& paged = json.at("runs").at(0).at("paged");
  CHECK(paged.at("block_size") == 4);
  CHECK(paged.at("reused_by_other_request").get<std::int64_t>() >= 1);
  // Request 1's first block is the one request 0 held first.
  const Json& first = paged.at("block_lifetimes").at(0);
  CHECK(first.at("request") == 0);
  CHECK(first.at("next_request") == 1);
  std::vector<std::size_t> steps{6};
  cross_check(good, steps);
  paged_cross_check(good);

  // The same cache freeing a block one row early fails; its explanation
  // gives the request's block table where the failure is.
  Report bad;
  bad.context.command = "kvcheck replay (report agreement test, paged free-early)";
  bad.runs.push_back(run_paged(reuse, "free-early"));
  REQUIRE_FALSE(bad.passed());
  paged_cross_check(bad);
  // It fails at the free: the first failure names the slot it freed and the row there.
  check_freed_detail(bad);

  // A ring run carries no block tables.
  std::vector<std::size_t> ring_steps;
  const Report ring = replay({{"fast/state-reuse-after-finish.json", "none"}}, &ring_steps);
  CHECK_FALSE(Json::parse(kvcheck::reports::report_json_text(ring)).at("runs").at(0).contains("paged"));
  CHECK(kvcheck::reports::report_html(ring).find("block-tables") == std::string::npos);
}

TEST_CASE("Reports agree: two caches side by side, what was compared and every differing step, in every format") {
  // A real pair of runs: the scenario on the CPU ring pool as written and
  // with its planted fault (the second cache), compared step by step.
  const auto sc = kvcheck::scenarios::load_scenario_file(kSource + "/scenarios/regressions/fault-accept-no-rollback.json");
  kvcheck::properties::RunOptions plain;
  kvcheck::properties::RunOptions faulty;
  faulty.fault = "accept-no-rollback";
  const auto first = kvcheck::properties::make_provider(plain);
  const auto second = kvcheck::properties::make_provider(faulty);
  plain.against = "cpu";
  kvcheck::properties::PairRun pair = kvcheck::properties::run_pair(sc, plain, *first, *second);
  REQUIRE(pair.comparison.differ());
  Report report;
  report.context.command = "kvcheck check (report agreement test)";
  kvcheck::reports::CheckSummary check;
  check.cases = 1;
  check.failures = 1;
  check.queries = pair.comparison.counts.queries;
  check.queries_not_output_checked = pair.comparison.counts.queries - pair.comparison.counts.outputs;
  kvcheck::reports::SideBySide side;
  side.property = "agreement";
  side.first = "cpu";
  side.second = "cpu";
  side.compared = pair.comparison.counts;
  for (const auto& d : pair.comparison.differences) side.differences.push_back(kvcheck::properties::difference_text(d));
  check.side_by_side = side;
  report.check = check;
  report.runs.push_back(pair.a);
  report.runs.push_back(pair.b);
  const std::string line = kvcheck::reports::side_by_side_text(side);
  CHECK(line.find(std::to_string(side.compared.steps) + " steps") != std::string::npos);
  const std::string text = kvcheck::reports::report_text(report);
  const Json json = kvcheck::reports::report_to_json(report);
  const std::string junit = unescape(kvcheck::reports::report_junit(report));
  const std::string html = unescape(kvcheck::reports::report_html(report));
  CHECK(text.find(line) != std::string::npos);
  CHECK(junit.find(line) != std::string::npos);
  CHECK(html.find(line) != std::string::npos);
  const Json& j = json["check"]["side_by_side"];
  CHECK(j["steps_compared"] == side.compared.steps);
  CHECK(j["resident_compared"] == side.compared.resident);
  CHECK(j["queries_compared"] == side.compared.queries);
  CHECK(j["reads_compared"] == side.compared.reads);
  CHECK(j["outputs_compared"] == side.compared.outputs);
  CHECK(j["differences"].size() == side.differences.size());
  for (const auto& d : side.differences) {
    INFO(d);
    CHECK(text.find("differs: " + d) != std::string::npos);
    CHECK(junit.find("differs: " + d) != std::string::npos);
    CHECK(html.find("<li>" + d + "</li>") != std::string::npos);
  }
  // A report of one cache has no side-by-side field at all.
  report.check->side_by_side.reset();
  CHECK_FALSE(kvcheck::reports::report_to_json(report)["check"].contains("side_by_side"));
}

TEST_CASE("Reports agree: a request begun from a shared prefix is named once, in every format") {
  Report bad;
  bad.context.command = "kvcheck replay (report agreement test, prefix cow-skipped)";
  bad.runs.push_back(run_paged(kPrefixScenario, "cow-skipped", "--prefix-cache"));
  REQUIRE_FALSE(bad.passed());
  const auto& run = bad.runs[0];
  REQUIRE(run.prefixes.size() == 1);
  const auto& p = run.prefixes[0];
  CHECK(p.request == 0);
  CHECK(p.source == 1);
  CHECK(p.positions == 5);
  CHECK(p.stored_again == 0);  // the adapter shares the rows, it does not store them again
  CHECK(p.begin_step == 3);    // request 0's first step
  const std::string said = kvcheck::reports::prefix_text(p);
  CHECK(said == "request 0 began from request 1's first 5 positions (shared)");

  const std::string text = kvcheck::reports::report_text(bad);
  const Json json = Json::parse(kvcheck::reports::report_json_text(bad));
  const std::string junit = kvcheck::reports::report_junit(bad);
  const std::string html = kvcheck::reports::report_html(bad);
  INFO(text);
  // JSON: the run's prefixes, each with its text.
  const Json& jp = json.at("runs").at(0).at("prefixes");
  REQUIRE(jp.size() == 1);
  CHECK(jp.at(0).at("request") == p.request);
  CHECK(jp.at(0).at("source") == p.source);
  CHECK(jp.at(0).at("positions") == p.positions);
  CHECK(jp.at(0).at("stored_again") == p.stored_again);
  CHECK(jp.at(0).at("begin_step") == p.begin_step);
  CHECK(jp.at(0).at("text") == said);
  // Text and JUnit's failure: once, in the explanation, after the failing step's line.
  const std::string line = "  " + said + "\n";
  const std::size_t at = text.find(line);
  REQUIRE(at != std::string::npos);
  CHECK(text.find(line, at + 1) == std::string::npos);
  CHECK(text.rfind("\n  step 5 (verify, layer 0, request 0", at) != std::string::npos);
  const std::string escaped = kvcheck::reports::detail::xml_escape(said);
  CHECK(junit.find(escaped) != std::string::npos);
  // HTML: the run's list of prefixes and the note of the step that began the request.
  const std::size_t section = html.find("<section class=\"run\" id=\"run-0\"");
  REQUIRE(section != std::string::npos);
  CHECK(html.find("<ul class=\"prefixes\">\n<li>" + escaped + "</li>\n</ul>", section) != std::string::npos);
  std::int64_t noted = 0;
  for (const auto& row : table_rows(html, "steps", section)) {
    if (row.size() < 13) continue;
    const bool has = row[12].find(said) != std::string::npos;
    CHECK(has == (row[0] == std::to_string(p.begin_step) && row[3] == std::to_string(p.request)));
    noted += has ? 1 : 0;
  }
  CHECK(noted == 1);

  // The correct cache passes the same case, and still says where request 0 began.
  Report good;
  good.context.command = "kvcheck replay (report agreement test, prefix)";
  good.runs.push_back(run_paged(kPrefixScenario, "", "--prefix-cache"));
  REQUIRE(good.passed());
  REQUIRE(good.runs[0].prefixes.size() == 1);
  CHECK(good.runs[0].prefixes[0] == p);
  CHECK(Json::parse(kvcheck::reports::report_json_text(good)).at("runs").at(0).at("prefixes").at(0).at("text") == said);

  // The other forms: rows stored again at the begin, one position, and the
  // explanation's lines up to a step, cut after four.
  kvcheck::properties::PrefixObservation some{
      .request = 2, .source = 0, .positions = 4, .stored_again = 1, .begin_step = 7};
  CHECK(kvcheck::reports::prefix_text(some) ==
        "request 2 began from request 0's first 4 positions (1 stored again, 3 shared)");
  some.stored_again = 4;
  CHECK(kvcheck::reports::prefix_text(some) == "request 2 began from request 0's first 4 positions (stored again)");
  some = {.request = 3, .source = 1, .positions = 1, .stored_again = 0, .begin_step = 9};
  CHECK(kvcheck::reports::prefix_text(some) == "request 3 began from request 1's first 1 position (shared)");
  kvcheck::properties::RunObservation many;
  for (std::int64_t r = 1; r <= 6; ++r)
    many.prefixes.push_back(
        {.request = r, .source = 0, .positions = 2, .stored_again = 0, .begin_step = r * 10});
  CHECK(kvcheck::reports::prefix_lines(many, 25).size() == 2);  // begun at steps 10 and 20
  const auto cut = kvcheck::reports::prefix_lines(many, -1);
  REQUIRE(cut.size() == 5);
  CHECK(cut[3] == kvcheck::reports::prefix_text(many.prefixes[3]));
  CHECK(cut[4] == "\u2026 (2 more)");

  // A run without prefixes says nothing of them.
  std::vector<std::size_t> steps;
  const Report plain = replay({{"regressions/fault-freed-state-readable.json", "freed-state-readable"}}, &steps);
  REQUIRE_FALSE(plain.passed());
  CHECK_FALSE(Json::parse(kvcheck::reports::report_json_text(plain)).at("runs").at(0).contains("prefixes"));
  CHECK(kvcheck::reports::report_text(plain).find("began from") == std::string::npos);
  CHECK(kvcheck::reports::report_html(plain).find("prefixes") == std::string::npos);
}
