// JUnit XML writer.
#include "reports/report_junit.hpp"

#include "reports/report_text.hpp"
#include "reports/xml_escape.hpp"

namespace kvcheck::reports {

namespace detail {

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      switch (b) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&apos;"; break;
        default:
          // XML 1.0 has no escape for C0 controls other than tab, LF, CR (nor DEL's neighbours).
          if (b < 0x20 && b != '\t' && b != '\n' && b != '\r') {
            out += kReplacement;
          } else {
            out += static_cast<char>(b);
          }
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: decode it strictly (no overlong forms, no
    // surrogates, nothing past U+10FFFF) and keep it only when XML 1.0 allows
    // the character (U+FFFE and U+FFFF are not characters); anything else,
    // including a byte that is not UTF-8 at all, becomes one U+FFFD.
    std::size_t len = 0;
    char32_t cp = 0;
    char32_t min = 0;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2, cp = b & 0x1F, min = 0x80;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3, cp = b & 0x0F, min = 0x800;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4, cp = b & 0x07, min = 0x10000;
    }
    bool ok = len != 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) {
        ok = false;
      } else {
        cp = (cp << 6) | (p[i + k] & 0x3F);
      }
    }
    const bool well_formed = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (well_formed && cp != 0xFFFE && cp != 0xFFFF) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      // One U+FFFD for a well-formed sequence of a forbidden character;
      // otherwise for this byte alone, resynchronizing on the next one.
      out += kReplacement;
      i += well_formed ? len : 1;
    }
  }
  return out;
}

}  // namespace detail

std::string report_junit(const Report& report) {
  using detail::xml_escape;
  const auto& ctx = report.context;
  const RunCounts counts = run_counts(report);
  std::int64_t tests = counts.runs;
  std::int64_t failures = counts.failed;
  const std::int64_t skipped = counts.refused + counts.skipped;
  if (report.check) {
    ++tests;
    failures += report.check->passed() ? 0 : 1;
  }
  // Without a check, a report where nothing ran fails (Report::passed): one
  // failing test case says so, as every skipped one alone would look green.
  const bool nothing_ran = !report.check && report.parts.empty() && counts.ran == 0;
  if (nothing_ran) {
    ++tests;
    ++failures;
  }
  const PartCounts parts = part_counts(report);
  tests += parts.parts;
  failures += parts.parts - parts.as_meant;

  const std::string suite = "kvcheck." + ctx.backend + "." + ctx.fault;
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<testsuites name=\"kvcheck\" tests=\"" + std::to_string(tests) + "\" failures=\"" +
         std::to_string(failures) + "\" errors=\"0\">\n";
  out += "  <testsuite name=\"" + xml_escape(suite) + "\" tests=\"" + std::to_string(tests) +
         "\" failures=\"" + std::to_string(failures) + "\" errors=\"0\" skipped=\"" +
         std::to_string(skipped) + "\">\n";
  out += "    <properties>\n";
  const auto property = [&out](const std::string& name, const std::string& value) {
    out += "      <property name=\"" + xml_escape(name) + "\" value=\"" + xml_escape(value) + "\"/>\n";
  };
  property("tool_version", ctx.tool_version);
  property("seed", std::to_string(ctx.seed));
  property("backend", ctx.backend);
  property("fault", ctx.fault);
  property("precision_bits", std::to_string(ctx.precision_bits));
  property("precision_requested", std::to_string(ctx.precision_requested));
  property("command", ctx.command);
  // What ran, so a CI dashboard never shows a green suite over cases that
  // were refused or skipped (README "Counts").
  // A command of several parts counts its parts; their runs are theirs.
  if (!report.parts.empty()) {
    property("parts", part_counts_text(parts));
  } else {
    property("runs", run_counts_text(counts));
  }
  if (report.check) {
    const auto& c = *report.check;
    property("cases", std::to_string(c.cases));
    property("cases_ran", std::to_string(c.ran()));
    property("cases_refused", std::to_string(c.refused));
    property("cases_skipped", std::to_string(c.skipped));
    property("queries_not_output_checked", std::to_string(c.queries_not_output_checked));
  } else if (report.parts.empty()) {
    property("queries_not_output_checked", std::to_string(counts.queries_not_output_checked));
  }
  out += "    </properties>\n";

  for (const auto& run : report.runs) {
    out += "    <testcase classname=\"" + xml_escape(suite) + "\" name=\"" + xml_escape(run.scenario_name) +
           "\"";
    if (run.skipped) {
      out += ">\n      <skipped message=\"" + xml_escape(run.skip_reason) + "\"/>\n    </testcase>\n";
      continue;
    }
    if (run.passed) {
      out += "/>\n";
      continue;
    }
    const std::string message = run.first_failure.empty() ? std::string("run failed") : run.first_failure;
    out += ">\n      <failure message=\"" + xml_escape(message) + "\" type=\"kvcheck.run\">" +
           xml_escape(run_explanation(report, run)) + "</failure>\n    </testcase>\n";
  }
  if (nothing_ran) {
    const std::string message = run_counts_text(counts);  // "N runs: no run ran, ..."
    out += "    <testcase classname=\"" + xml_escape(suite) + "\" name=\"runs\">\n      <failure message=\"" +
           xml_escape(message) + "\" type=\"kvcheck.nothing-ran\">" + xml_escape(message) +
           "</failure>\n    </testcase>\n";
  }
  if (report.check) {
    const auto& c = *report.check;
    out += "    <testcase classname=\"" + xml_escape(suite) + "\" name=\"property check\"";
    const std::string side = c.side_by_side ? "\n" + side_by_side_text(*c.side_by_side) : std::string();
    if (c.passed()) {
      out += ">\n      <system-out>" + xml_escape(check_counts_text(c) + side) + "</system-out>\n    </testcase>\n";
    } else {
      std::string body = check_counts_text(c) + side + "\n";
      if (c.side_by_side) {
        for (const auto& d : c.side_by_side->differences) body += "differs: " + d + "\n";
      }
      for (const auto& k : c.coverage) {
        if (!k.met()) {
          body += "coverage " + k.name + ": " + std::to_string(k.count) + " below minimum " +
                  std::to_string(k.minimum) + "\n";
        }
      }
      if (!c.counterexample_file.empty()) body += "counterexample: " + c.counterexample_file + "\n";
      if (c.shows_failing_case_seed()) body += "failing case seed: " + std::to_string(c.failing_case_seed) + "\n";
      if (c.depends_on_earlier) {
        body += earlier_cases_text(*c.depends_on_earlier, c.failing_case_seed) + "\n";
        if (!c.depends_on_earlier->reproduced)
          body += "first failure in its process: " + c.depends_on_earlier->first_failure_there + "\n";
      }
      if (!c.replay_command.empty()) body += "replay: " + c.replay_command + "\n";
      const std::string message = c.failures != 0      ? std::to_string(c.failures) + " failing case(s)"
                                  : !c.run_share_met() ? "only " + std::to_string(c.ran()) + " of " +
                                                             std::to_string(c.cases) + " cases ran"
                                                       : std::string("coverage below minimum");
      out += ">\n      <failure message=\"" + xml_escape(message) + "\" type=\"kvcheck.check\">" +
             xml_escape(body) + "</failure>\n    </testcase>\n";
    }
  }
  // One test case per part (the demo), passing when the part showed what it
  // is meant to (a planted fault caught); its text in <system-out>.
  for (const auto& part : report.parts) {
    out += "    <testcase classname=\"" + xml_escape(suite) + "\" name=\"" + xml_escape(part.title) + "\">\n";
    if (!part.as_meant()) {
      const std::string message = part.planted_fault ? "planted fault not caught" : "part failed";
      out += "      <failure message=\"" + xml_escape(message) + "\" type=\"kvcheck.part\">" +
             xml_escape(part_verdict_line(part)) + "</failure>\n";
    }
    out += "      <system-out>" + xml_escape(part.text + part_verdict_line(part)) + "</system-out>\n    </testcase>\n";
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

}  // namespace kvcheck::reports
