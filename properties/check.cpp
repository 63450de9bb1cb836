#include "properties/check.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <thread>

#include "model/real.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/assert.hpp"
#include "support/error.hpp"
#include "support/prng.hpp"

namespace kvcheck::properties {

namespace {

using scenarios::Scenario;
using scenarios::StepKind;

bool valid(const Scenario& sc) {
  try {
    scenarios::validate_scenario(sc);
    return true;
  } catch (const Error&) {
    return false;
  }
}

/// Every one-step-smaller variant of `sc`, most aggressive first.
std::vector<Scenario> variants(const Scenario& sc) {
  std::vector<Scenario> out;
  // Drop a whole request.
  if (sc.requests.size() > 1) {
    for (std::size_t r = 0; r < sc.requests.size(); ++r) {
      Scenario v = sc;
      const std::int64_t id = sc.requests[r].id;
      v.requests.erase(v.requests.begin() + static_cast<std::ptrdiff_t>(r));
      std::erase_if(v.steps, [id](const scenarios::Step& s) { return s.request == id; });
      out.push_back(std::move(v));
    }
  }
  // Drop one step, or a verify together with its accept.
  for (std::size_t i = 0; i < sc.steps.size(); ++i) {
    Scenario v = sc;
    v.steps.erase(v.steps.begin() + static_cast<std::ptrdiff_t>(i));
    out.push_back(v);
    if (sc.steps[i].kind == StepKind::kVerify) {
      for (std::size_t j = i + 1; j < sc.steps.size(); ++j) {
        if (sc.steps[j].request == sc.steps[i].request && sc.steps[j].kind == StepKind::kAccept) {
          Scenario w = sc;
          w.steps.erase(w.steps.begin() + static_cast<std::ptrdiff_t>(j));
          w.steps.erase(w.steps.begin() + static_cast<std::ptrdiff_t>(i));
          out.push_back(std::move(w));
          break;
        }
      }
    }
  }
  // Smaller steps.
  for (std::size_t i = 0; i < sc.steps.size(); ++i) {
    const auto& s = sc.steps[i];
    if (s.kind == StepKind::kPrefill && s.rows > 1) {
      for (const std::int64_t rows : {s.rows / 2, s.rows - 1}) {
        Scenario v = sc;
        v.steps[i].rows = std::max<std::int64_t>(1, rows);
        out.push_back(std::move(v));
      }
    }
    if (s.kind == StepKind::kVerify && s.drafts > 0) {
      Scenario v = sc;
      v.steps[i].drafts -= 1;
      for (std::size_t j = i + 1; j < v.steps.size(); ++j) {
        if (v.steps[j].request == s.request && v.steps[j].kind == StepKind::kAccept) {
          v.steps[j].accepted = std::min(v.steps[j].accepted, v.steps[i].drafts);
          break;
        }
      }
      out.push_back(std::move(v));
    }
    if (s.kind == StepKind::kAccept && s.accepted > 0) {
      Scenario v = sc;
      v.steps[i].accepted -= 1;
      out.push_back(std::move(v));
    }
  }
  // Simpler cache: one layer, fewer heads, narrower heads, exact rows, no RoPE.
  auto with = [&](auto&& edit) {
    Scenario v = sc;
    edit(v.cache);
    out.push_back(std::move(v));
  };
  if (sc.cache.layers > 1) with([](auto& c) { c.layers = 1; });
  if (sc.cache.q_heads > sc.cache.kv_heads) with([](auto& c) { c.q_heads = c.kv_heads; });
  if (sc.cache.kv_heads > 1)
    with([](auto& c) {
      c.kv_heads = 1;
      c.q_heads = 1;
    });
  if (sc.cache.head_dim > 2) {
    with([](auto& c) {
      c.head_dim /= 2;
      c.rope.rotary_dims = std::min(c.rope.rotary_dims, c.head_dim);
    });
  }
  if (sc.cache.format != scenarios::Format::kF64) with([](auto& c) { c.format = scenarios::Format::kF64; });
  if (sc.cache.rope.style != scenarios::RopeStyle::kNone) {
    with([](auto& c) { c.rope = scenarios::Rope{}; });
  }
  if (sc.cache.sink_logit) with([](auto& c) { c.sink_logit.reset(); });
  if (sc.cache.shared_row) with([](auto& c) { c.shared_row = false; });
  return out;
}

}  // namespace

std::string shell_quote(const std::string& text) {
  const bool plain =
      !text.empty() &&
      text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,+@") ==
          std::string::npos;
  if (plain) return text;
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string replay_arguments(const RunOptions& run) {
  std::string out = "--impl " + shell_quote(run.backend);
  if (run.fault != impl::Fault::kNone) out += " --fault " + std::string(impl::fault_name(run.fault));
  return out;
}

std::uint64_t case_seed(std::uint64_t seed, std::int64_t index) {
  return mix_seed(seed, static_cast<std::uint64_t>(index));
}

Scenario shrink_scenario(const Scenario& failing, const std::function<bool(const Scenario&)>& fails,
                         std::int64_t* runs) {
  Scenario best = failing;
  bool progress = true;
  while (progress) {
    progress = false;
    for (Scenario& v : variants(best)) {
      // Explicit rows of dropped positions are harmless; keep data as is.
      if (!valid(v)) continue;
      if (runs) ++*runs;
      if (fails(v)) {
        best = std::move(v);
        progress = true;
        break;
      }
    }
  }
  return best;
}

namespace {

/// The coordinating thread's cache provider (capabilities, shrinking), or a
/// worker's own (an exec adapter is one child process per worker).
std::unique_ptr<engines::CacheProvider> new_provider(const CheckOptions& options) {
  if (!options.provider_factory) return make_provider(options.run);
  std::unique_ptr<engines::CacheProvider> made = options.provider_factory();
  if (!made) throw Error(ErrorId::kUsage, "provider_factory", "the provider factory returned no provider");
  return made;
}

CaseTally run_cases_with(const CheckOptions& options, engines::CacheProvider& main_provider) {
  const Shard shard = options.shard;
  KVCHECK_ASSERT(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count);
  const std::int64_t total = std::max<std::int64_t>(options.cases, 0);
  // This shard's cases: index = shard.index + k * shard.count.
  const std::int64_t mine = shard.index < total ? (total - shard.index + shard.count - 1) / shard.count : 0;
  const auto case_index = [&shard](std::int64_t k) { return shard.index + k * shard.count; };
  const int threads = std::max(1, options.threads);
  // The coordinating provider's capabilities steer the generator.
  const engines::Capabilities caps = main_provider.capabilities();
  CaseTally tally;
  tally.cases = mine;
  tally.reachable = reachable_coverage(caps, options.profile);
  const std::size_t classes = tally.reachable.size();

  // Results are added up as cases finish (sums commute, so the tally does
  // not depend on which worker ran what): nothing is sized by the case count.
  std::atomic<std::int64_t> failures{0}, skipped{0};
  std::vector<std::atomic<std::int64_t>> coverage(classes);
  std::atomic<std::int64_t> next{0}, done{0};
  std::atomic<std::int64_t> first_failure{mine};                              // in this shard's numbering k
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));  // read after join only
  std::atomic<bool> worker_failed{false};

  auto worker = [&](int id) {
    try {
      RunOptions run = options.run;
      run.record_reads = false;
      run.record_ring = false;
      std::unique_ptr<engines::CacheProvider> provider;
      for (;;) {
        const std::int64_t k = next.fetch_add(1);
        if (k >= mine) break;
        const std::int64_t i = case_index(k);
        if (!provider) {
          provider = new_provider(options);
          run.provider = provider.get();
        }
        const Scenario sc = generate_scenario(case_seed(options.seed, i), caps, options.profile);
        RunObservation obs;
        try {
          obs = run_scenario(sc, run);
        } catch (const Error& e) {
          // Name the case, so the failing schedule can be regenerated.
          throw Error(e.id(), e.where(),
                      e.rule() + "\n(check case " + std::to_string(i) + ", case seed " +
                          std::to_string(case_seed(options.seed, i)) + ")");
        }
        if (obs.skipped) {
          skipped.fetch_add(1);
        } else {
          const std::vector<bool> flags = coverage_flags(classify(sc), options.profile);
          for (std::size_t c = 0; c < classes; ++c) coverage[c].fetch_add(flags[c] ? 1 : 0);
        }
        if (!obs.passed) {
          failures.fetch_add(1);
          std::int64_t cur = first_failure.load();
          while (k < cur && !first_failure.compare_exchange_weak(cur, k)) {
          }
        }
        done.fetch_add(1);
      }
    } catch (...) {
      errors[static_cast<std::size_t>(id)] = std::current_exception();
      next.store(mine);
      worker_failed.store(true);
    }
    model::release_thread_caches();
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  while (done.load() < mine) {
    if (worker_failed.load()) break;
    if (options.progress) options.progress(done.load(), mine);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : pool) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  if (options.progress) options.progress(mine, mine);

  tally.failures = failures.load();
  tally.skipped = skipped.load();
  for (const auto& c : coverage) tally.coverage_counts.push_back(c.load());
  if (first_failure.load() < mine) tally.first_failing_case = case_index(first_failure.load());
  return tally;
}

CheckResult finish_with(const CheckOptions& options, const CaseTally& tally,
                        const std::function<engines::CacheProvider&()>& main_provider) {
  CheckResult result;
  result.cases = tally.cases;
  result.failures = tally.failures;
  result.skipped = tally.skipped;
  result.coverage_counts = tally.coverage_counts;
  result.reachable = tally.reachable;
  for (std::size_t k = 0; k < result.coverage_counts.size(); ++k) {
    if (result.reachable[k]) result.coverage_ok = result.coverage_ok && result.coverage_counts[k] > 0;
  }
  if (tally.first_failing_case < 0) return result;

  engines::CacheProvider& provider = main_provider();
  result.found_failure = true;
  result.failing_case_seed = case_seed(options.seed, tally.first_failing_case);
  result.original = generate_scenario(result.failing_case_seed, provider.capabilities(), options.profile);
  RunOptions run = options.run;
  run.record_reads = false;
  run.record_ring = false;
  run.provider = &provider;
  result.shrunk = shrink_scenario(
      result.original,
      [&run](const Scenario& s) {
        const RunObservation obs = run_scenario(s, run);
        return !obs.passed && !obs.skipped;
      },
      &result.shrink_runs);
  const std::string what = options.run.fault != impl::Fault::kNone
                               ? std::string(impl::fault_name(options.run.fault))
                               : options.run.backend.substr(0, options.run.backend.find(':'));
  result.shrunk.name = "counterexample-" + what + "-seed" + std::to_string(options.seed);
  result.shrunk.description = "Shrunk from case seed " + std::to_string(result.failing_case_seed) +
                              " of `kvcheck check " + replay_arguments(options.run) + " --seed " +
                              std::to_string(options.seed) + "`";
  RunOptions final_run = options.run;
  final_run.provider = &provider;
  result.shrunk_run = run_scenario(result.shrunk, final_run);
  return result;
}

}  // namespace

CaseTally run_cases(const CheckOptions& options) {
  const std::unique_ptr<engines::CacheProvider> main_provider = new_provider(options);
  return run_cases_with(options, *main_provider);
}

CaseTally merge_tallies(const std::vector<CaseTally>& shards) {
  CaseTally total;
  total.reachable =
      shards.empty() ? std::vector<bool>(coverage_names().size(), true) : shards.front().reachable;
  total.coverage_counts.assign(total.reachable.size(), 0);
  for (const CaseTally& t : shards) {
    KVCHECK_ASSERT(t.reachable == total.reachable &&
                   t.coverage_counts.size() == total.coverage_counts.size());
    total.cases += t.cases;
    total.failures += t.failures;
    total.skipped += t.skipped;
    for (std::size_t k = 0; k < t.coverage_counts.size(); ++k)
      total.coverage_counts[k] += t.coverage_counts[k];
    if (t.first_failing_case >= 0 &&
        (total.first_failing_case < 0 || t.first_failing_case < total.first_failing_case)) {
      total.first_failing_case = t.first_failing_case;
    }
  }
  return total;
}

CheckResult finish_check(const CheckOptions& options, const CaseTally& tally) {
  std::unique_ptr<engines::CacheProvider> provider;
  return finish_with(options, tally, [&]() -> engines::CacheProvider& {
    if (!provider) provider = new_provider(options);
    return *provider;
  });
}

CheckResult run_check(const CheckOptions& options) {
  // One provider for the capabilities, the cases' generator and the
  // shrinker, as a single process has always used.
  const std::unique_ptr<engines::CacheProvider> main_provider = new_provider(options);
  CheckOptions whole = options;
  whole.shard = Shard{};
  const CaseTally tally = run_cases_with(whole, *main_provider);
  return finish_with(whole, tally, [&]() -> engines::CacheProvider& { return *main_provider; });
}

}  // namespace kvcheck::properties
