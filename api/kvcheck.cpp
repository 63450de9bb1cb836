#include "api/kvcheck.hpp"

#include <atomic>
#include <utility>

#include "properties/agreement.hpp"
#include "properties/check.hpp"
#include "properties/generator.hpp"
#include "properties/runner.hpp"
#include "reports/report.hpp"
#include "reports/report_text.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

namespace kvcheck::api {

namespace {

/// A provider the caller owns, lent to run_check (which wants owned ones).
class BorrowedProvider final : public engines::CacheProvider {
 public:
  explicit BorrowedProvider(engines::CacheProvider& inner) : inner_(inner) {}
  const engines::Capabilities& capabilities() override { return inner_.capabilities(); }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    return inner_.open(spec, refused);
  }
  std::string name() const override { return inner_.name(); }

 private:
  engines::CacheProvider& inner_;
};

properties::RunOptions run_options(const std::string& name, bool probes, int precision_bits) {
  properties::RunOptions run;
  run.backend = name;  // reports show the provider's name
  run.probes = probes;
  run.precision_bits = precision_bits;
  return run;
}

reports::Report report_of(const std::string& cache, std::uint64_t seed, int precision_bits) {
  reports::Report report;
  report.context.backend = cache;
  report.context.seed = seed;
  report.context.precision_bits = properties::reference_significand_bits(precision_bits);
  report.context.precision_requested = precision_bits;
  return report;
}

}  // namespace

CheckResult check(const ProviderFactory& factory, const CheckOptions& options) {
  if (!factory) throw Error(ErrorId::kUsage, "factory", "check needs a provider factory");
  CheckResult out;
  out.seed = options.seed;
  out.precision_bits = options.precision_bits;
  // The first provider names the cache, then serves run_check's coordinating
  // thread (its first call, made before any worker starts).
  auto first = std::make_shared<std::unique_ptr<engines::CacheProvider>>(factory());
  if (!*first) throw Error(ErrorId::kUsage, "factory", "the provider factory returned no provider");
  out.cache = (*first)->name();
  auto handed_out = std::make_shared<std::atomic<bool>>(false);

  properties::CheckOptions check;
  check.cases = options.cases;
  check.seed = options.seed;
  check.threads = options.threads;
  check.progress = options.progress;
  check.run = run_options(out.cache, options.probes, options.precision_bits);
  check.provider_factory = [first, handed_out, factory]() -> std::unique_ptr<engines::CacheProvider> {
    if (!handed_out->exchange(true)) return std::move(*first);
    return factory();
  };
  if (options.against && options.repeat_bitwise) {
    throw Error(ErrorId::kUsage, "repeat_bitwise", "two runs of one cache: not with against");
  }
  if (options.bitwise && !options.against) {
    throw Error(ErrorId::kUsage, "bitwise", "compares two caches' outputs: needs against");
  }
  check.run.repeat_bitwise = out.repeat_bitwise = options.repeat_bitwise;
  check.run.bitwise = out.bitwise = options.bitwise;
  if (options.repeat_bitwise) out.against = out.cache;
  if (options.against) {
    // As the first: the provider made to read the name serves the first call.
    auto second = std::make_shared<std::unique_ptr<engines::CacheProvider>>(options.against());
    if (!*second) throw Error(ErrorId::kUsage, "against", "the against provider factory returned no provider");
    out.against = (*second)->name();
    check.run.against = out.against;
    auto second_out = std::make_shared<std::atomic<bool>>(false);
    check.against_provider_factory = [second, second_out,
                                      against = options.against]() -> std::unique_ptr<engines::CacheProvider> {
      if (!second_out->exchange(true)) return std::move(*second);
      return against();
    };
  }
  properties::CheckResult r = properties::run_check(check);
  out.compared = r.compared;
  out.differences = r.difference.differences;

  out.cases = r.cases;
  out.failures = r.failures;
  out.skipped = r.skipped;
  out.coverage_ok = r.coverage_ok;
  const auto& names = properties::coverage_names();
  for (std::size_t i = 0; i < names.size() && i < r.coverage_counts.size(); ++i) {
    out.coverage.push_back({names[i], r.coverage_counts[i], i < r.reachable.size() && r.reachable[i],
                            i < r.coverage_minimums.size() ? r.coverage_minimums[i] : 0});
  }
  out.found_failure = r.found_failure;
  out.passed = !r.found_failure && r.coverage_ok;
  if (r.found_failure) {
    out.failing_case_seed = r.failing_case_seed;
    out.original = std::move(r.original);
    out.counterexample = std::move(r.shrunk);
    out.counterexample.name = "counterexample-seed" + std::to_string(options.seed);
    out.counterexample.description = "Shrunk from case seed " + std::to_string(out.failing_case_seed) +
                                     " of " + std::to_string(options.cases) + " cases (seed " +
                                     std::to_string(options.seed) + ") of kvcheck::api::check on " +
                                     out.cache;
    out.counterexample_run = std::move(r.shrunk_run);
    out.counterexample_run.scenario_name = out.counterexample.name;
    out.counterexample_run_against = std::move(r.shrunk_run_b);
    out.shrink_runs = r.shrink_runs;
    if (!options.counterexample_path.empty()) {
      const auto parent = options.counterexample_path.parent_path();
      if (!parent.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(parent, ec);
        if (ec) throw Error(ErrorId::kIo, parent.string(), "cannot create the directory: " + ec.message());
      }
      scenarios::write_scenario_file(options.counterexample_path, out.counterexample);
      out.counterexample_file = options.counterexample_path;
    }
  }
  return out;
}

CheckResult check(engines::CacheProvider& provider, const CheckOptions& options) {
  CheckOptions one = options;
  one.threads = 1;
  return check([&provider] { return std::make_unique<BorrowedProvider>(provider); }, one);
}

std::vector<properties::RunObservation> replay(engines::CacheProvider& provider,
                                               const std::vector<std::filesystem::path>& files_or_dirs,
                                               const ReplayOptions& options) {
  std::vector<std::string> args;
  for (const auto& p : files_or_dirs) args.push_back(p.string());
  const auto files = scenarios::collect_scenario_files(args);
  // Load everything first: a bad file stops the replay before anything runs.
  std::vector<scenarios::Scenario> loaded;
  for (const auto& f : files) {
    loaded.push_back(scenarios::load_scenario_file(f));
    if (loaded.back().name.empty()) loaded.back().name = f.stem().string();
  }
  properties::RunOptions run = run_options(provider.name(), options.probes, options.precision_bits);
  run.provider = &provider;
  std::vector<properties::RunObservation> runs;
  for (const auto& sc : loaded) runs.push_back(properties::run_scenario(sc, run));
  return runs;
}

bool all_passed(const std::vector<properties::RunObservation>& runs) noexcept {
  for (const auto& r : runs) {
    if (!r.passed || r.skipped) return false;
  }
  return true;
}

std::string summary(const CheckResult& result) {
  reports::Report report = report_of(result.cache, result.seed, result.precision_bits);
  reports::CheckSummary c;
  c.cases = result.cases;
  c.failures = result.failures;
  for (const auto& k : result.coverage) c.coverage.push_back({k.name, k.count, k.reachable ? 1 : 0});
  c.counterexample_file = result.counterexample_file.string();
  c.failing_case_seed = result.failing_case_seed;
  if (!result.against.empty()) {
    reports::SideBySide b;
    b.property = result.repeat_bitwise ? "repeat-bitwise" : "agreement";
    b.bitwise = result.bitwise || result.repeat_bitwise;
    b.first = result.cache;
    b.second = result.against;
    b.compared = result.compared;
    for (const auto& d : result.differences) b.differences.push_back(properties::difference_text(d));
    c.side_by_side = std::move(b);
  }
  report.check = c;
  if (result.found_failure) report.runs.push_back(result.counterexample_run);
  if (result.found_failure && !result.against.empty()) report.runs.push_back(result.counterexample_run_against);
  return reports::report_text(report);
}

std::string summary(const std::vector<properties::RunObservation>& runs, int precision_bits) {
  reports::Report report = report_of(runs.empty() ? std::string() : runs.front().backend, 0, precision_bits);
  report.runs = runs;
  return reports::report_text(report);
}

}  // namespace kvcheck::api
