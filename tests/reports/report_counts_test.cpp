// Every report format shows what ran: cases (or runs) run, refused,
// skipped, and queries not output-checked; a check where too few cases ran
// and a report where no run ran are FAIL in every format (issue 18 item 4).
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "reports/report.hpp"
#include "reports/report_html.hpp"
#include "reports/report_json.hpp"
#include "reports/report_junit.hpp"
#include "reports/report_text.hpp"

namespace {

using kvcheck::properties::RunObservation;
using kvcheck::reports::CheckSummary;
using kvcheck::reports::Report;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The check of the issue: 2000 cases, 1761 refused by the cache.
Report refused_check(double min_run_share) {
  Report report;
  CheckSummary c;
  c.cases = 2000;
  c.refused = 1761;
  c.skipped = 3;
  c.queries = 5000;
  c.queries_not_output_checked = 17;
  c.min_run_share = min_run_share;
  c.coverage.push_back({"ring wrap", 40, 1});
  report.check = c;
  return report;
}

RunObservation run_of(const std::string& name, bool skipped, bool refused, std::int64_t queries,
                      std::int64_t not_checked) {
  RunObservation run;
  run.scenario_name = name;
  run.skipped = skipped;
  run.refused = refused;
  run.skip_reason = skipped ? (refused ? "the cache refused the configuration" : "not supported") : "";
  run.queries = queries;
  run.queries_not_output_checked = not_checked;
  return run;
}

}  // namespace

TEST_CASE("Counts: a check where 1761 of 2000 cases were refused fails in every format, with its counts") {
  const Report report = refused_check(0.8);
  REQUIRE(report.check->ran() == 236);
  REQUIRE_FALSE(report.check->run_share_met());
  REQUIRE_FALSE(report.passed());
  const std::string counts = "2000 cases: 236 ran, 1761 refused, 3 skipped";

  const std::string text = kvcheck::reports::report_text(report);
  CHECK(has(text, "\nFAIL: " + counts +
                      " (below the minimum share 0.8 of cases run); 0 failed; 17 of 5000 "
                      "queries not output-checked\n"));
  CHECK_FALSE(has(text, "PASS"));

  const auto j = nlohmann::json::parse(kvcheck::reports::report_json_text(report));
  CHECK(j["verdict"] == "fail");
  CHECK(j["check"]["verdict"] == "fail");
  CHECK(j["check"]["ran"] == 236);
  CHECK(j["check"]["refused"] == 1761);
  CHECK(j["check"]["skipped"] == 3);
  CHECK(j["check"]["run_share_met"] == false);
  CHECK(j["check"]["min_run_share"] == 0.8);
  CHECK(j["check"]["queries_not_output_checked"] == 17);

  const std::string junit = kvcheck::reports::report_junit(report);
  CHECK(has(junit, "failures=\"1\""));
  CHECK(has(junit, "<property name=\"cases_refused\" value=\"1761\"/>"));
  CHECK(has(junit, "message=\"only 236 of 2000 cases ran\""));

  const std::string html = kvcheck::reports::report_html(report);
  CHECK(has(html, "<title>kvcheck report: FAIL</title>"));
  CHECK(has(html, counts));
}

TEST_CASE("Counts: the same check under a lower gate passes and still names its refusals") {
  const Report report = refused_check(0.1);
  REQUIRE(report.passed());
  const std::string text = kvcheck::reports::report_text(report);
  CHECK(has(text,
            "\nPASS: 2000 cases: 236 ran, 1761 refused, 3 skipped; 0 failed; 17 of 5000 queries not "
            "output-checked\n"));
  CHECK(has(kvcheck::reports::report_junit(report), "<system-out>2000 cases: 236 ran, 1761 refused"));
  const auto j = nlohmann::json::parse(kvcheck::reports::report_json_text(report));
  CHECK(j["verdict"] == "pass");
  CHECK(j["check"]["run_share_met"] == true);
}

TEST_CASE("Counts: runs that were all refused or skipped are no PASS, in any format") {
  Report report;
  report.runs.push_back(run_of("a", true, true, 0, 0));
  report.runs.push_back(run_of("b", true, false, 0, 0));
  REQUIRE_FALSE(report.passed());
  const std::string text = kvcheck::reports::report_text(report);
  CHECK(has(text, "\nFAIL: 2 runs: no run ran, 1 refused, 1 skipped; 0 of 0 queries not output-checked\n"));
  const auto j = nlohmann::json::parse(kvcheck::reports::report_json_text(report));
  CHECK(j["verdict"] == "fail");
  CHECK(j["summary"]["ran_runs"] == 0);
  CHECK(j["summary"]["refused_runs"] == 1);
  CHECK(j["summary"]["skipped_runs"] == 1);
  CHECK(j["runs"][0]["refused"] == true);
  CHECK(j["runs"][1]["refused"] == false);
  const std::string junit = kvcheck::reports::report_junit(report);
  CHECK(has(junit, "tests=\"3\" failures=\"1\""));
  CHECK(has(junit, "type=\"kvcheck.nothing-ran\""));
  CHECK(has(kvcheck::reports::report_html(report), "<title>kvcheck report: FAIL</title>"));

  // No runs at all (and no check) is no verdict either.
  CHECK_FALSE(Report{}.passed());
}

TEST_CASE("Counts: one run that ran passes, and the counts add its queries not output-checked") {
  Report report;
  report.runs.push_back(run_of("ran", false, false, 40, 6));
  report.runs.push_back(run_of("skipped", true, false, 0, 0));
  REQUIRE(report.passed());
  const auto counts = kvcheck::reports::run_counts(report);
  CHECK(counts.ran == 1);
  CHECK(counts.passed == 1);
  CHECK(counts.skipped == 1);
  CHECK(counts.queries == 40);
  CHECK(counts.queries_not_output_checked == 6);
  const std::string text = kvcheck::reports::report_text(report);
  CHECK(has(text, "PASS  ran  "));
  CHECK(has(text, " not_output_checked=6"));
  CHECK(has(text,
            "\nPASS: 2 runs: 1 ran (1 passed, 0 failed), 0 refused, 1 skipped; 6 of 40 queries not "
            "output-checked\n"));
  const auto j = nlohmann::json::parse(kvcheck::reports::report_json_text(report));
  CHECK(j["summary"]["queries_not_output_checked"] == 6);
  CHECK(j["runs"][0]["totals"]["queries_not_output_checked"] == 6);
  CHECK(has(kvcheck::reports::report_html(report), "6 of 40 queries not output-checked"));
  CHECK(has(kvcheck::reports::report_junit(report),
            "<property name=\"queries_not_output_checked\" value=\"6\"/>"));
}
