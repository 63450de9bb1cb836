#include "pipelines/replay.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "engines/factory.hpp"
#include "properties/agreement.hpp"
#include "properties/memory_estimate.hpp"
#include "reports/report_text.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"

namespace kvcheck::pipelines {

std::vector<scenarios::Scenario> load_replay_scenarios(const std::vector<std::string>& files_or_dirs) {
  const auto files = scenarios::collect_scenario_files(files_or_dirs);
  if (files.empty()) throw Error(ErrorId::kUsage, "FILE", "no *.json scenario files found");
  // Load everything first: a bad file stops the run before anything is written.
  std::vector<scenarios::Scenario> loaded;
  for (const auto& f : files) loaded.push_back(scenarios::load_scenario_file(f));
  for (std::size_t i = 0; i < loaded.size(); ++i) {
    if (loaded[i].name.empty()) loaded[i].name = files[i].stem().string();
  }
  return loaded;
}

std::function<void(std::int64_t)> long_work_meter(
    const std::string& what, double reads, double all_layer_reads, const properties::MemoryEstimate& memory,
    const std::function<void(std::int64_t, std::int64_t)>& progress, std::FILE* notes) {
  if (reads <= properties::kLongWorkReads) return nullptr;
  if (notes != nullptr) {
    std::fprintf(notes, "kvcheck %s: about %s (--work-limit ROWS refuses such runs)\n", what.c_str(),
                 properties::work_text(reads, memory).c_str());
    std::fflush(notes);
  }
  if (!progress) return nullptr;
  struct Meter {
    std::int64_t done = 0, total = 0;
    std::chrono::steady_clock::time_point last;
  };
  auto meter = std::make_shared<Meter>();
  meter->total = static_cast<std::int64_t>(std::max(all_layer_reads, 1.0));
  meter->last = std::chrono::steady_clock::now();
  progress(0, meter->total);
  return [meter, progress](std::int64_t judged) {
    meter->done += judged;
    const auto now = std::chrono::steady_clock::now();
    if (now - meter->last < std::chrono::milliseconds(100)) return;
    meter->last = now;
    // The estimate takes the widest window for every layer: never past it.
    progress(std::min(meter->done, meter->total - 1), meter->total);
  };
}

int run_replay(const std::vector<scenarios::Scenario>& loaded, const ReplayRequest& request,
               std::int64_t memory_limit_bytes, const std::string& limit_source) {
  properties::RunOptions options = request.run;
  reports::Report report;
  report.context = report_context(request.command, 0, options.backend, options.fault, options.precision_bits);
  // Refused before any cache is opened when the runs would not fit, or take
  // longer than the user allows; long work is announced, then shown.
  const properties::WorkEstimate work = properties::estimate_replay_work(loaded);
  const properties::MemoryEstimate memory = properties::estimate_replay(loaded, options);
  properties::require_work(work, "the replay", request.work_limit);
  properties::require_memory(memory, memory_limit_bytes, limit_source);
  options.on_query_judged =
      long_work_meter("replay", work.reads, work.all_layer_reads, memory, request.progress, request.notes);
  // An earlier run's files go before any run: a replay that ends without a
  // verdict (an adapter that dies, a signal) leaves none of them looking current.
  withdraw_report_files(request.files, request.record);
  std::vector<reports::OutputFile> extra;
  if (request.record) {
    // Every run goes through a recording wrapper; the trace holds them all,
    // in memory, and is written with the report files as one set.
    auto trace = std::make_shared<scenarios::TraceWriter>();
    report.runs = record_runs(loaded, options, trace);
    extra.push_back({*request.record, trace->text()});
  } else if (properties::runs_side_by_side(options)) {
    // Two caches side by side (--against, --repeat-bitwise): each file runs
    // on both, both runs are reported, and the comparison is the verdict.
    const std::unique_ptr<engines::CacheProvider> provider = properties::make_provider(options);
    const std::unique_ptr<engines::CacheProvider> second =
        options.against.empty() ? nullptr : properties::make_provider(properties::second_run(options));
    reports::CheckSummary check;
    check.cases_drawn = false;
    reports::SideBySide b;
    b.property = properties::side_by_side_property(options);
    b.first = options.backend;
    b.second = properties::second_run(options).backend;
    b.bitwise = options.bitwise || options.repeat_bitwise;
    for (const auto& sc : loaded) {
      properties::PairRun pair = properties::run_pair(sc, options, *provider, second ? *second : *provider);
      const properties::PairComparison& c = pair.comparison;
      ++check.cases;
      if (c.skipped) ++(c.refused ? check.refused : check.skipped);
      if (c.differ()) ++check.failures;
      check.queries += c.counts.queries;
      check.queries_not_output_checked += c.counts.queries - c.counts.outputs;
      b.compared += c.counts;
      for (const auto& d : c.differences) b.differences.push_back(sc.name + ": " + properties::difference_text(d));
      report.runs.push_back(std::move(pair.a));
      report.runs.push_back(std::move(pair.b));
    }
    check.side_by_side = std::move(b);
    report.check = std::move(check);
  } else {
    // One provider for every file (one adapter process for exec).
    const std::unique_ptr<engines::CacheProvider> provider = properties::make_provider(options);
    options.provider = provider.get();
    for (const auto& sc : loaded) report.runs.push_back(properties::run_scenario(sc, options));
  }
  if (options.on_query_judged && request.progress) {
    const auto total = static_cast<std::int64_t>(std::max(work.all_layer_reads, 1.0));
    request.progress(total, total);  // ends the progress line
  }
  const std::string text = reports::report_text(report);
  std::fputs(text.c_str(), stdout);
  return write_report_files(report, text, request.files, std::move(extra));
}

}  // namespace kvcheck::pipelines
