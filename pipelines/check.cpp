#include "pipelines/check.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <system_error>

#include "engines/factory.hpp"
#include "engines/trace_cache.hpp"
#include "pipelines/catalog.hpp"
#include "properties/generator.hpp"
#include "properties/option_table.hpp"
#include "properties/runner.hpp"
#include "reports/report_html.hpp"
#include "reports/report_json.hpp"
#include "reports/report_junit.hpp"
#include "reports/report_text.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/atomic_write.hpp"
#include "support/error.hpp"

namespace kvcheck::pipelines {

namespace fs = std::filesystem;

namespace {

/// "FIELD[k]", as JSON paths name an array's element.
std::string jr_index(const std::string& field, std::size_t k) {
  return field + "[" + std::to_string(k) + "]";
}

/// The coverage lines of the summary: the schedule classes the cache can
/// reach, the cases that exercised each declared feature, and how many
/// pairs of them met (the fewest, and every pair that did not).
void print_coverage(const properties::CheckResult& result) {
  const auto& names = properties::coverage_names();
  const auto& kinds = properties::coverage_kinds();
  const auto below = [&result](std::size_t i) { return result.coverage_counts[i] < result.coverage_minimums[i]; };
  const auto refused = [&result](std::size_t i) {
    return result.coverage_counts[i] == 0 && result.coverage_refused[i] > 0;
  };
  const auto show = [&](std::size_t i, const std::string& name) {
    std::printf(" %s=%lld", name.c_str(), static_cast<long long>(result.coverage_counts[i]));
    if (below(i)) std::printf("(FAIL: no case exercised it)");
    if (refused(i)) std::printf("(refused by the cache in all %lld drawn)", static_cast<long long>(result.coverage_refused[i]));
  };
  std::printf("coverage:");
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (kinds[i] == properties::CoverageKind::kSchedule && (result.reachable[i] || result.coverage_counts[i] > 0))
      show(i, names[i]);
  }
  // The cache's own kernel paths, last (counted everywhere, gated where reachable).
  for (std::size_t k = 0; k < result.kernel_paths.size(); ++k) show(names.size() + k, result.kernel_paths[k]);
  std::printf("\nfeatures (cases exercising each declared feature):");
  std::size_t declared = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (kinds[i] != properties::CoverageKind::kFeature || !result.reachable[i]) continue;
    ++declared;
    show(i, names[i].substr(names[i].find(':') + 1));
  }
  if (declared == 0) std::printf(" none declared");
  if (declared > 0 && result.cases < properties::kFeatureGateCases)
    std::printf("; gated from %lld cases", static_cast<long long>(properties::kFeatureGateCases));
  std::size_t pairs = 0, met = 0, fewest = 0;
  std::vector<std::size_t> unmet;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (kinds[i] != properties::CoverageKind::kPair || !result.reachable[i]) continue;
    ++pairs;
    if (result.coverage_counts[i] > 0) {
      ++met;
      if (fewest == 0 || result.coverage_counts[i] < result.coverage_counts[fewest]) fewest = i;
    } else {
      unmet.push_back(i);
    }
  }
  std::printf("\nfeature pairs: %zu of %zu met in one case", met, pairs);
  if (met > 0) {
    std::printf(" (fewest: %s %lld)", names[fewest].substr(names[fewest].find(':') + 1).c_str(),
                static_cast<long long>(result.coverage_counts[fewest]));
  }
  for (const std::size_t i : unmet) show(i, names[i].substr(names[i].find(':') + 1));
  if (pairs > 0 && result.cases < properties::kPairGateCases)
    std::printf("; pairs gated from %lld cases", static_cast<long long>(properties::kPairGateCases));
  std::printf("%s\n", result.coverage_ok ? "" : "  (a gated class was never reached: FAIL)");
}

/// Prints the summary and fills `report` (the counterexample as an
/// attachment) from a finished check; returns the exit code. Shared by one process, the merge
/// of shards and MPI rank 0, so all three print and write the same.
int report_check(const properties::CheckOptions& options, const properties::CheckResult& result,
                 const std::string& timing, const fs::path& out_dir, reports::Report& report) {
  reports::CheckSummary summary;
  summary.cases = result.cases;
  summary.failures = result.failures;
  summary.refused = result.refused;
  summary.skipped = result.skipped;
  summary.queries = result.queries;
  summary.queries_not_output_checked = result.queries_not_output_checked;
  summary.min_run_share = options.min_run_share;
  summary.max_failures = options.max_failures;
  summary.cases_not_run = result.cases_not_run;
  auto names = properties::coverage_names();
  names.insert(names.end(), result.kernel_paths.begin(), result.kernel_paths.end());  // the cache's own, last
  for (std::size_t i = 0; i < names.size(); ++i) {
    // Only what the generator can draw for this cache is listed (a feature
    // it does not declare, ring wrap without a window, are not); its gate
    // is the result's: 0 for a pair under kPairGateCases cases, a class the
    // cache refused whenever it was drawn, or without the gate
    // (--no-coverage-gate, --case-seed).
    if (!result.reachable[i] && result.coverage_counts[i] == 0) continue;
    summary.coverage.push_back({names[i], result.coverage_counts[i], result.coverage_minimums[i]});
  }
  summary.failing_case_seed = result.failing_case_seed;
  summary.failing_case_seeds = result.failing_case_seeds;
  summary.observed = result.observed;
  const bool side_by_side = properties::runs_side_by_side(options.run);
  if (side_by_side) {
    reports::SideBySide b;
    b.property = properties::side_by_side_property(options.run);
    b.first = options.run.backend;
    b.second = properties::second_run(options.run).backend;
    b.bitwise = options.run.bitwise || options.run.repeat_bitwise;
    b.compared = result.compared;
    for (const auto& d : result.difference.differences) b.differences.push_back(properties::difference_text(d));
    summary.side_by_side = std::move(b);
  }
  if (result.found_failure) {
    // Written with the reports, as one set (write_reports); the directory
    // is made now, as a failure to make it shows as the set's write error.
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    const fs::path file = out_dir / (result.shrunk.name + ".json");
    std::string replayed;  // the files to replay before the counterexample, in their order
    if (!result.reproduces_alone) {
      // The cases that ran before it, written beside it as NAME-before-NNNN.json
      // (sorted, as replay runs files, before NAME.json): replayed in one
      // cache in that order they reproduce the failure.
      reports::EarlierCases earlier;
      earlier.earlier_cases_run = result.earlier_cases_run;
      earlier.case_seeds = result.earlier_case_seeds;
      earlier.reproduced = result.reproduces_after_earlier;
      earlier.first_failure_there = result.first_failure_there;
      for (std::size_t j = 0; j < result.earlier_cases.size(); ++j) {
        char number[24];
        std::snprintf(number, sizeof number, "%04zu", j);
        scenarios::Scenario sc = result.earlier_cases[j];
        sc.name = result.shrunk.name + "-before-" + number;
        const fs::path earlier_file = out_dir / (sc.name + ".json");
        report.attachments.push_back({earlier_file, scenarios::save_scenario(sc)});
        earlier.files.push_back(earlier_file.string());
      }
      if (earlier.files.size() > 8) {
        replayed = properties::shell_quote((out_dir / result.shrunk.name).string()) + "-before-*.json ";
      } else {
        for (const auto& f : earlier.files) replayed += properties::shell_quote(f) + " ";
      }
      summary.depends_on_earlier = std::move(earlier);
    }
    report.attachments.push_back({file, scenarios::save_scenario(result.shrunk)});
    summary.counterexample_file = file.string();
    summary.replay_command = "kvcheck replay " + replayed + properties::shell_quote(file.string()) + " " +
                             properties::replay_arguments(options.run);
    report.runs.push_back(result.shrunk_run);
    if (side_by_side) report.runs.push_back(result.shrunk_run_b);
  }
  report.check = summary;
  // The counts lead: "PASS" over cases that never ran is not a verdict.
  std::printf(
      "check: %lld cases (%lld ran, %lld refused, %lld skipped), %lld failing, seed %llu, backend %s, "
      "fault %s%s\n",
      static_cast<long long>(result.cases), static_cast<long long>(result.ran()),
      static_cast<long long>(result.refused), static_cast<long long>(result.skipped),
      static_cast<long long>(result.failures), static_cast<unsigned long long>(options.seed),
      options.run.backend.c_str(), options.run.fault.c_str(),
      options.profile == properties::Profile::kDefault
          ? ""
          : (", profile " + properties::profile_name(options.profile)).c_str());
  if (result.cases_not_run > 0) {
    std::printf(
        "stopped after %lld failing cases (--max-failures): the first %lld cases counted, %lld not run; "
        "coverage not gated\n",
        static_cast<long long>(options.max_failures), static_cast<long long>(result.cases),
        static_cast<long long>(result.cases_not_run));
  }
  if (result.refused > 0) {
    std::printf("refused: %lld cases the cache refused to open\n", static_cast<long long>(result.refused));
  }
  if (result.skipped > 0) {
    std::printf("skipped: %lld cases outside the cache's declared capabilities\n",
                static_cast<long long>(result.skipped));
  }
  if (side_by_side) {
    // A PASS must have compared something: the counts say how much.
    std::printf("%s\n", reports::side_by_side_text(*summary.side_by_side).c_str());
  }
  std::printf("not output-checked: %lld of %lld queries\n",
              static_cast<long long>(result.queries_not_output_checked),
              static_cast<long long>(result.queries));
  if (!result.run_share_ok) {
    std::printf(
        "FAIL: only %lld of %lld cases ran (%.1f%%), below --min-run-share %s: the cache refused or "
        "could not take the rest\n",
        static_cast<long long>(result.ran()), static_cast<long long>(result.cases),
        result.cases > 0 ? 100.0 * static_cast<double>(result.ran()) / static_cast<double>(result.cases)
                         : 0.0,
        reports::format_double(options.min_run_share).c_str());
  }
  print_coverage(result);
  if (result.block_size > 0 && result.ran() > 0) {
    const double ran = static_cast<double>(result.ran());
    std::printf(
        "blocks: per case %.2f freed by the window, %.2f at finish or reset, %.2f reused (block size %lld; %lld, "
        "%lld and %lld in %lld cases)\n",
        static_cast<double>(result.block_window_frees) / ran, static_cast<double>(result.block_end_frees) / ran,
        static_cast<double>(result.block_reuses) / ran, static_cast<long long>(result.block_size),
        static_cast<long long>(result.block_window_frees), static_cast<long long>(result.block_end_frees),
        static_cast<long long>(result.block_reuses), static_cast<long long>(result.ran()));
  }
  if (!options.coverage_gate) {
    std::printf("coverage gate: off (%s): a class no case reached does not fail this check\n",
                options.only_case_seed ? "--case-seed runs one case" : "--no-coverage-gate");
  }
  if (result.crashes_not_reproduced > 0) {
    std::printf(
        "crashed once, not again: %lld cases whose cache crashed passed when run again alone in a fresh "
        "cache (not failures; the cache is not deterministic)\n",
        static_cast<long long>(result.crashes_not_reproduced));
  }
  if (result.found_failure && !result.reproduces_alone) {
    // Never an empty "first failure:": say what is known, and how to get it back.
    const auto& earlier = *summary.depends_on_earlier;
    std::printf(
        "counterexample: depends on earlier cases: case seed %llu failed after %lld earlier cases in its "
        "process but passes alone in a fresh cache (the engine keeps state across close/open, or is not "
        "deterministic)\n",
        static_cast<unsigned long long>(result.failing_case_seed),
        static_cast<long long>(result.earlier_cases_run));
    std::string seeds;
    for (std::size_t j = 0; j < earlier.case_seeds.size(); ++j) {
      if (j == 8) {
        seeds += " ... (" + std::to_string(earlier.case_seeds.size() - j) + " more, in report.json)";
        break;
      }
      seeds += " " + std::to_string(earlier.case_seeds[j]);
    }
    if (earlier.reproduced) {
      std::printf("  reproduced in a fresh cache after the %zu case(s) before it, case seeds%s\n",
                  earlier.case_seeds.size(), seeds.c_str());
      std::printf("  first failure: %s\n", result.shrunk_run.first_failure.c_str());
    } else {
      std::printf("  not reproduced in a fresh cache after the last %zu case(s) before it either%s%s\n",
                  earlier.case_seeds.size(), seeds.empty() ? "" : ", case seeds", seeds.c_str());
      std::printf("  first failure in its process: %s\n", result.first_failure_there.c_str());
    }
    std::printf("  written to %s (with the %zu case(s) before it)\n  replay: %s\n",
                summary.counterexample_file.c_str(), earlier.files.size(), summary.replay_command.c_str());
  } else if (result.found_failure) {
    std::printf(
        "counterexample: %zu requests, %zu steps (shrunk from %zu steps in %lld runs), case seed %llu\n",
        result.shrunk.requests.size(), result.shrunk.steps.size(), result.original.steps.size(),
        static_cast<long long>(result.shrink_runs),
        static_cast<unsigned long long>(result.failing_case_seed));
    if (side_by_side) {
      // The first difference on one screen, then every other differing step in one line each.
      const auto& diffs = summary.side_by_side->differences;
      std::printf("  first difference (A = %s, B = %s):\n    %s\n", summary.side_by_side->first.c_str(),
                  summary.side_by_side->second.c_str(), diffs.empty() ? "(none)" : diffs.front().c_str());
      for (std::size_t k = 1; k < diffs.size() && k < 8; ++k) std::printf("  then: %s\n", diffs[k].c_str());
      if (diffs.size() > 8) std::printf("  ... %zu more differing steps (report.json)\n", diffs.size() - 8);
      // Each cache against the reference on the same case, for context.
      for (const auto* run : {&result.shrunk_run, &result.shrunk_run_b}) {
        std::printf("  %s against the reference: %s\n", run == &result.shrunk_run ? "A" : "B",
                    run->skipped  ? ("not run: " + run->skip_reason).c_str()
                    : run->passed ? "passes"
                                  : ("fails: " + run->first_failure).c_str());
      }
    } else {
      std::printf("  first failure: %s\n", result.shrunk_run.first_failure.c_str());
    }
    std::printf("  written to %s\n  replay: %s\n", summary.counterexample_file.c_str(),
                summary.replay_command.c_str());
    properties::CheckOptions one = options;
    one.only_case_seed = result.failing_case_seed;
    std::printf("  rerun the case as drawn: kvcheck check %s\n", properties::case_arguments(one).c_str());
  }
  std::printf("time: %s\n", timing.c_str());
  return result.found_failure || !result.coverage_ok || !result.run_share_ok ? 1 : 0;
}

/// "0.41 s, 725 cases/s on 2 threads", or "0.02 s merging 3 shards" when
/// `cases` < 0: printed, never written into a report.
std::string timing_text(std::int64_t cases, double seconds, const std::string& workers) {
  char text[160];
  if (cases < 0) {
    std::snprintf(text, sizeof text, "%.2f s %s", seconds, workers.c_str());
  } else {
    std::snprintf(text, sizeof text, "%.2f s, %.0f cases/s on %s", seconds,
                  seconds > 0 ? static_cast<double>(cases) / seconds : 0.0, workers.c_str());
  }
  return text;
}

/// The options every shard of one check must share.
pipelines::CheckShardOptions shard_options(const properties::CheckOptions& options,
                                         const std::string& command) {
  pipelines::CheckShardOptions o;
  o.impl = options.run.backend;
  o.fault = options.run.fault;
  o.cases = options.cases;
  o.seed = options.seed;
  o.precision_requested = options.run.precision_bits;
  o.step_timeout_seconds = options.run.step_timeout_seconds;
  o.command = command;
  o.profile = properties::profile_name(options.profile);
  o.min_run_share = options.min_run_share;
  o.case_seed = options.only_case_seed;
  o.coverage_gate = options.coverage_gate;
  return o;
}

}  // namespace

reports::ReportContext report_context(const std::string& command, std::uint64_t seed,
                                      const std::string& backend, const std::string& fault,
                                      int precision_requested) {
  reports::ReportContext ctx;
  ctx.precision_bits = properties::reference_significand_bits(precision_requested);
  ctx.precision_requested = precision_requested;
  ctx.seed = seed;
  ctx.backend = backend;
  ctx.fault = fault;
  ctx.command = command;
  return ctx;
}

int write_set_keeping_verdict(const std::vector<reports::OutputFile>& files, int code) {
  try {
    reports::write_output_set(files);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fprintf(stderr, "kvcheck: the verdict (%s) stands; its files were not written\n",
                 code == 1   ? "FAIL"
                 : code == 0 ? "PASS"
                             : "error");
    return code == 1 ? 1 : 2;
  }
  return code;
}

int write_report_files(const reports::Report& report, const std::string& text, const ReportFiles& files,
                       std::vector<reports::OutputFile> extra) {
  std::vector<reports::OutputFile> outputs;
  if (files.text) outputs.push_back({*files.text, text});
  if (files.json) outputs.push_back({*files.json, reports::report_json_text(report)});
  if (files.junit) outputs.push_back({*files.junit, reports::report_junit(report)});
  if (files.html) outputs.push_back({*files.html, reports::report_html(report)});
  for (auto& f : extra) outputs.push_back(std::move(f));
  return write_set_keeping_verdict(outputs, report.passed() ? 0 : 1);
}

std::vector<reports::NamedOutput> named_outputs(const ReportFiles& files) {
  std::vector<reports::NamedOutput> named;
  if (files.text) named.push_back({"--text", *files.text});
  if (files.json) named.push_back({"--report", *files.json});
  if (files.junit) named.push_back({"--junit", *files.junit});
  if (files.html) named.push_back({"--html", *files.html});
  return named;
}

std::vector<reports::NamedOutput> report_set_outputs(const fs::path& dir) {
  std::vector<reports::NamedOutput> named;
  for (const char* name : {"report.json", "report.txt", "report.html", "junit.xml"})
    named.push_back({"--out", dir / name});
  return named;
}

int write_reports(const reports::Report& report, const fs::path& dir, int code,
                  std::vector<reports::OutputFile> extra) {
  std::error_code ec;
  fs::create_directories(dir, ec);  // a failure shows as the set's write error
  std::vector<reports::OutputFile> files = report.attachments;
  files.push_back({dir / "report.json", reports::report_json_text(report)});
  files.push_back({dir / "report.txt", reports::report_text(report)});
  files.push_back({dir / "report.html", reports::report_html(report)});
  files.push_back({dir / "junit.xml", reports::report_junit(report)});
  for (auto& f : extra) files.push_back(std::move(f));
  return write_set_keeping_verdict(files, code);
}

std::vector<properties::RunObservation> record_runs(const std::vector<scenarios::Scenario>& scenarios_in,
                                                    properties::RunOptions options,
                                                    const std::shared_ptr<scenarios::TraceWriter>& trace) {
  auto recorder = engines::make_recording_provider(properties::make_provider(options), trace, "kvcheck");
  options.provider = recorder.get();
  std::vector<properties::RunObservation> runs;
  for (const auto& sc : scenarios_in) {
    recorder->set_scenario(sc);
    runs.push_back(properties::run_scenario(sc, options));
  }
  trace->check();
  return runs;
}

void record_check_run(const properties::CheckOptions& options, const reports::Report& report,
                      const std::shared_ptr<scenarios::TraceWriter>& trace) {
  // The counterexample is read from the report's attachment (the report set,
  // the trace with it, is not written yet), else from its file.
  std::optional<scenarios::Scenario> counterexample;
  if (report.check && !report.check->counterexample_file.empty()) {
    for (const auto& a : report.attachments) {
      if (a.path == fs::path(report.check->counterexample_file))
        counterexample = scenarios::parse_scenario(a.content, report.check->counterexample_file);
    }
    if (!counterexample) counterexample = scenarios::load_scenario_file(report.check->counterexample_file);
  }
  const scenarios::Scenario sc =
      counterexample ? *counterexample
                     : properties::generate_scenario(properties::check_case_seed(options, 0),
                                                     properties::make_provider(options.run)->capabilities(),
                                                     options.profile);
  record_runs({sc}, options.run, trace);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run_check_into(const properties::CheckOptions& options, const fs::path& out_dir,
                   reports::Report& report) {
  const auto start = std::chrono::steady_clock::now();
  const properties::CheckResult result = properties::run_check(options);
  return report_check(
      options, result,
      timing_text(result.cases, seconds_since(start), std::to_string(options.threads) + " threads"), out_dir,
      report);
}

std::string check_shard_text(const properties::CheckOptions& options, const std::string& command,
                             const properties::CaseTally& tally) {
  return pipelines::shard_text(
      "check", reports::ReportContext{}.tool_version, options.shard.index, options.shard.count,
      pipelines::check_options_json(shard_options(options, command)), pipelines::tally_json(tally));
}

void prepare_out_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw Error(ErrorId::kIo, "--out",
                "cannot create directory '" + dir.string() +
                    "': " + (ec ? ec.message() : std::string("a file is in the way")));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error(ErrorId::kIo, "--out", "directory '" + dir.string() + "' is not writable");
  }
  reports::withdraw_output_files(report_set_files(dir));
}

std::vector<fs::path> report_set_files(const fs::path& dir) {
  // The names write_reports writes, and the counterexamples check writes
  // beside them ("counterexample-WHAT-seedN.json", report_check).
  std::vector<fs::path> files = {dir / "report.json", dir / "report.txt", dir / "report.html",
                                 dir / "junit.xml"};
  std::error_code ec;
  std::vector<fs::path> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("counterexample-", 0) == 0 && it->path().extension() == ".json")
      found.push_back(it->path());
  }
  std::sort(found.begin(), found.end());  // a fixed order (directory order is not)
  files.insert(files.end(), found.begin(), found.end());
  return files;
}

void withdraw_report_files(const ReportFiles& files, const std::optional<fs::path>& record) {
  std::vector<fs::path> paths;
  for (const auto& f : {files.text, files.json, files.junit, files.html, record}) {
    if (f) paths.push_back(*f);
  }
  reports::withdraw_output_files(paths);
}

int run_check(const properties::CheckOptions& options, const std::string& command, const fs::path& out_dir,
              const std::optional<std::string>& record) {
  reports::Report report;
  report.context = report_context(command, options.seed, options.run.backend, options.run.fault,
                                  options.run.precision_bits);
  const int checked = run_check_into(options, out_dir, report);
  // The counterexample when a case failed, else case 0: one run a reader can
  // audit, traced in memory and written with the reports as one set.
  std::vector<reports::OutputFile> extra;
  if (record) {
    const auto trace = std::make_shared<scenarios::TraceWriter>();
    record_check_run(options, report, trace);
    extra.push_back({fs::path(*record), trace->text()});
  }
  const int code = write_reports(report, out_dir, checked, std::move(extra));
  if (code != checked) return code;
  std::printf("reports: %s/report.{json,txt,html}, %s/junit.xml\n", out_dir.string().c_str(),
              out_dir.string().c_str());
  if (record) std::printf("trace: %s\n", record->c_str());
  return code;
}

int run_check_shard(const properties::CheckOptions& options, const std::string& command,
                    const fs::path& out_dir) {
  const auto start = std::chrono::steady_clock::now();
  const fs::path file = out_dir / pipelines::kShardFileName;
  // An earlier shard document goes before any case runs: a shard that dies
  // leaves no earlier tally for `merge` to take as this run's.
  reports::withdraw_output_files({file});
  const properties::CaseTally tally = properties::run_cases(options);
  write_file_atomic(file, check_shard_text(options, command, tally));
  std::printf("check shard %lld/%lld: %lld of %lld cases, %lld failing",
              static_cast<long long>(options.shard.index), static_cast<long long>(options.shard.count),
              static_cast<long long>(tally.cases), static_cast<long long>(options.cases),
              static_cast<long long>(tally.failures));
  if (tally.first_failing_case >= 0)
    std::printf(" (lowest case %lld)", static_cast<long long>(tally.first_failing_case));
  std::printf(", %.2f s on %d threads\nshard: %s (join the shards with kvcheck merge)\n",
              seconds_since(start), options.threads, file.string().c_str());
  return 0;
}

properties::CheckOptions check_options_of(const pipelines::ShardResult& shard) {
  const pipelines::CheckShardOptions o = pipelines::check_options_from_json(shard);
  properties::CheckOptions options;
  options.cases = o.cases;
  options.seed = o.seed;
  options.run.backend = o.impl;
  options.run.precision_bits = o.precision_requested;
  options.run.step_timeout_seconds = o.step_timeout_seconds;
  options.min_run_share = o.min_run_share;
  options.only_case_seed = o.case_seed;
  options.coverage_gate = o.coverage_gate;
  if (!is_fault_name(o.fault)) {
    throw Error(ErrorId::kShard, shard.origin + ": options.fault", "unknown fault '" + o.fault + "'");
  }
  options.run.fault = o.fault;
  if (!properties::parse_profile(o.profile, &options.profile)) {
    throw Error(ErrorId::kShard, shard.origin + ": options.profile", "unknown profile '" + o.profile + "'");
  }
  return options;
}

int merge_check(const std::vector<pipelines::ShardResult>& shards, const fs::path& out_dir,
                const std::string& workers, std::chrono::steady_clock::time_point start, bool ran_cases,
                const std::optional<std::string>& engine) {
  const pipelines::ShardResult& front = shards.front();
  const pipelines::CheckShardOptions o = pipelines::check_options_from_json(front);
  properties::CheckOptions options = check_options_of(front);
  // The engine comes from the merge's own command line, never from a shard
  // document: it must be the one the shards recorded.
  if (engine && *engine != o.impl) {
    throw Error(ErrorId::kShard, front.origin + ": options.impl",
                "is '" + o.impl + "', but --impl is '" + *engine + "': not a shard of a run on this engine");
  }
  std::vector<properties::CaseTally> tallies;
  for (const auto& shard : shards) {
    tallies.push_back(
        pipelines::tally_from_json(shard, o.cases, properties::coverage_names().size()));
    if (tallies.back().reachable != tallies.front().reachable ||
        tallies.back().kernel_paths != tallies.front().kernel_paths) {
      throw Error(ErrorId::kShard, shard.origin,
                  "its cache reaches other coverage classes than " + front.origin + "'s: not the same cache");
    }
  }
  // Counts that cannot be added up are no tally of a real run.
  std::int64_t queries = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    if (__builtin_add_overflow(queries, tallies[s].queries, &queries)) {
      throw Error(ErrorId::kShard, shards[s].origin + ": result.queries",
                  "the shards' query counts overflow when added: not the tally of a run");
    }
  }
  // Which coverage classes the cache can reach, where the merge knows the
  // cache without running anything a shard names: the engine of --impl,
  // or an in-process cache that needs no device.
  std::optional<std::string> known = engine;
  if (!known && (o.impl == "cpu" || o.impl == "paged" || o.impl == "layer")) known = o.impl;
  if (known) {
    properties::RunOptions run = options.run;
    run.backend = *known;
    const std::vector<bool> reachable =
        properties::reachable_coverage(properties::make_provider(run)->capabilities(), options.profile);
    const auto& names = properties::coverage_names();
    for (std::size_t k = 0; k < reachable.size(); ++k) {
      if (reachable[k] != tallies.front().reachable[k]) {
        throw Error(ErrorId::kShard, front.origin + ": " + jr_index("result.reachable", k),
                    "records coverage class " + names[k] + " as " + (reachable[k] ? "un" : "") +
                        "reachable, but the cache " + *known + " can" + (reachable[k] ? "" : "not") +
                        " reach it: not the tally of a run on this cache");
      }
    }
  }
  // Every shard's failing case is re-run alone in a fresh cache of the
  // merge's engine: a shard whose failure does not reproduce is refused.
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::int64_t failing = tallies[s].first_failing_case;
    if (failing < 0) continue;
    // A built-in cache (cpu, cuda, paged, layer) is a name, not a command:
    // the merge opens it from the shards' record. Only an exec: adapter, a
    // command from a file, must come from the merge's own --impl.
    if (!engine && engines::is_exec(o.impl)) {
      throw Error(
          ErrorId::kUsage, "--impl",
          "is needed: " + shards[s].origin + " reports failing case " + std::to_string(failing) +
              ", which merge re-runs to confirm it; give the engine the shards ran (merge never runs a "
              "command from a shard document; this one records --impl " +
              properties::shell_quote(o.impl) + ")");
    }
    if (!properties::case_fails_alone(options, failing)) {
      throw Error(ErrorId::kShard, shards[s].origin + ": result.first_failing_case",
                  "case " + std::to_string(failing) + " (case seed " +
                      std::to_string(properties::check_case_seed(options, failing)) +
                      ") passes when re-run alone in a fresh cache on --impl " +
                      properties::shell_quote(engine.value_or(o.impl)) +
                      ": the shard's failure does not reproduce (it may depend on the cases before it in the "
                      "shard's process; run the check in one process to see)");
    }
  }
  prepare_out_dir(out_dir);
  reports::Report report;
  report.context = report_context(o.command, o.seed, o.impl, options.run.fault, o.precision_requested);
  const properties::CheckResult result =
      properties::finish_check(options, properties::merge_tallies(tallies));
  // A merge ran no case itself: its time is the merge's (with the shrinking).
  const double seconds = seconds_since(start);
  const std::string timing = ran_cases ? timing_text(result.cases, seconds, workers)
                                       : timing_text(-1, seconds, "merging " + workers);
  const int code = report_check(options, result, timing, out_dir, report);
  const int written = write_reports(report, out_dir, code);
  if (written == code) {
    std::printf("reports: %s/report.{json,txt,html}, %s/junit.xml\n", out_dir.string().c_str(),
                out_dir.string().c_str());
  }
  return written;
}

}  // namespace kvcheck::pipelines
