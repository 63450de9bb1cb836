// How tight the output tolerance is on a correct cache: generated cases run
// on the production CPU backend, each under every value profile, and per
// (profile, format) the ratio tolerance / measured error of every query
// whose error is not zero (median, 90th percentile, worst), the queries
// whose error is zero, and the share of queries that are not
// output-checked (their tolerance reaches the largest |value|). The error
// is taken as at least one unit roundoff of the accumulation times the
// largest |output| (a tolerance cannot be asked to be tighter than one
// rounding of the output; many queries are computed exactly). Goals
// (issue "PASS only where kvcheck looked"): median <= 1e2, worst <= 1e4, not
// output-checked 0. Any query outside its tolerance is counted as a false
// alarm (must be 0; the exit code is 1 otherwise). Run:
//   build/bench/tolerance_tightness_bench [default cases] [production cases] [backend]
// (defaults 400, 12, cpu; backend as `check --impl`: cpu, layer, exec:...).
// A case the backend cannot run (layer: one state, no shared rows) is skipped.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "properties/generator.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario_json.hpp"

namespace {

using kvcheck::properties::Profile;
using kvcheck::scenarios::ValueProfile;

std::int64_t skipped = 0;

struct Tally {
  std::vector<double> ratios;
  std::int64_t queries = 0, zero_error = 0, not_checked = 0, false_alarms = 0;
};

const char* value_profile_label(ValueProfile p) {
  switch (p) {
    case ValueProfile::kUniform: return "uniform";
    case ValueProfile::kLargeLogits: return "large-logits";
    case ValueProfile::kFp8Outliers: return "fp8-outliers";
    default: break;
  }
  return "?";
}

double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

void run_profile(Profile profile, std::int64_t count, const std::string& backend,
                 std::map<std::pair<std::string, std::string>, Tally>* out) {
  kvcheck::properties::RunOptions options;
  options.backend = backend;
  options.probes = false;
  options.record_reads = false;
  options.record_ring = false;
  const auto provider = kvcheck::properties::make_provider(options);
  options.provider = provider.get();
  const kvcheck::engines::Capabilities caps = provider->capabilities();
  for (std::int64_t i = 0; i < count; ++i) {
    const kvcheck::scenarios::Scenario base =
        kvcheck::properties::generate_scenario(static_cast<std::uint64_t>(1 + i), caps, profile);
    for (ValueProfile vp : {ValueProfile::kUniform, ValueProfile::kLargeLogits, ValueProfile::kFp8Outliers}) {
      if (vp == ValueProfile::kFp8Outliers && base.cache.format != kvcheck::scenarios::Format::kFp8) continue;
      kvcheck::scenarios::Scenario sc = base;
      sc.data.profile = vp;
      const auto run = kvcheck::properties::run_scenario(sc, options);
      if (run.skipped) {
        ++skipped;
        continue;
      }
      Tally& t =
          (*out)[{kvcheck::properties::profile_name(profile) + "/" + value_profile_label(vp), run.format}];
      for (const auto& step : run.steps) {
        for (const auto& q : step.queries) {
          ++t.queries;
          if (!q.output_checked) ++t.not_checked;
          if (!q.output_ok) ++t.false_alarms;
          // An error below one rounding of the output (u max|o|) is as
          // small as a tolerance can ever be: the ratio is taken to that.
          if (q.abs_diff == 0) ++t.zero_error;
          const double floor = (run.format == "f64" ? 0x1.0p-53 : 0x1.0p-24) * q.reference_max;
          const double err = std::max(q.abs_diff, floor);
          if (err > 0) t.ratios.push_back(q.tolerance / err);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t default_cases = argc > 1 ? std::atoll(argv[1]) : 400;
  const std::int64_t production_cases = argc > 2 ? std::atoll(argv[2]) : 12;
  const std::string backend = argc > 3 ? argv[3] : "cpu";
  std::map<std::pair<std::string, std::string>, Tally> tallies;
  run_profile(Profile::kDefault, default_cases, backend, &tallies);
  run_profile(Profile::kProduction, production_cases, backend, &tallies);
  std::printf("%-26s %-5s %9s %9s %10s %10s %10s %12s %8s\n", "profile/values", "fmt", "queries", "err=0",
              "median", "p90", "worst", "not-checked", "alarms");
  std::int64_t alarms = 0;
  for (auto& [key, t] : tallies) {
    const double median = quantile(t.ratios, 0.5), p90 = quantile(t.ratios, 0.9);
    const double worst = t.ratios.empty() ? 0 : *std::max_element(t.ratios.begin(), t.ratios.end());
    std::printf(
        "%-26s %-5s %9lld %9lld %10.3g %10.3g %10.3g %11.4f%% %8lld\n", key.first.c_str(), key.second.c_str(),
        static_cast<long long>(t.queries), static_cast<long long>(t.zero_error), median, p90, worst,
        t.queries > 0 ? 100.0 * static_cast<double>(t.not_checked) / static_cast<double>(t.queries) : 0.0,
        static_cast<long long>(t.false_alarms));
    alarms += t.false_alarms;
  }
  std::printf("cases skipped: %lld\nfalse alarms: %lld\n", static_cast<long long>(skipped),
              static_cast<long long>(alarms));
  return alarms == 0 ? 0 : 1;
}
