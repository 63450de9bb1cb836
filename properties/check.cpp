#include "properties/check.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "model/real.hpp"
#include "properties/option_table.hpp"
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

/// `sc` without its layers [from, to): their windows and explicit rows go
/// with them, and the later layers' rows take the numbers left free.
Scenario without_layers(const Scenario& sc, std::int32_t from, std::int32_t to) {
  Scenario v = sc;
  v.cache.layers -= to - from;
  if (!v.cache.layer_windows.empty()) {
    v.cache.layer_windows.erase(v.cache.layer_windows.begin() + from, v.cache.layer_windows.begin() + to);
  }
  std::erase_if(v.data.rows,
                [&](const scenarios::ExplicitRow& row) { return row.layer >= from && row.layer < to; });
  for (auto& row : v.data.rows) {
    if (row.layer >= to) row.layer -= to - from;
  }
  return v;
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
      // A request that started from its prefix starts from nothing now.
      for (auto& other : v.requests) {
        if (other.prefix && other.prefix->request == id) other.prefix.reset();
      }
      out.push_back(std::move(v));
    }
  }
  // Drop a feature from the whole case: every shared prefix, every trim,
  // the windows per layer (every layer then has the case's window), every
  // verify (each with its accept becomes a decode).
  const bool any_prefix = std::any_of(sc.requests.begin(), sc.requests.end(),
                                      [](const scenarios::Request& r) { return r.prefix.has_value(); });
  if (any_prefix) {
    Scenario v = sc;
    for (auto& r : v.requests) r.prefix.reset();
    out.push_back(std::move(v));
  }
  const auto is_trim = [](const scenarios::Step& s) { return s.kind == StepKind::kTrim; };
  if (std::any_of(sc.steps.begin(), sc.steps.end(), is_trim)) {
    Scenario v = sc;
    std::erase_if(v.steps, is_trim);
    out.push_back(std::move(v));
  }
  // Without the preempts (docs/semantics.md "Preemption"): a preempt writes
  // nothing; where one dropped a pending verify, the candidate is invalid and skipped.
  const auto is_preempt = [](const scenarios::Step& s) { return s.kind == StepKind::kPreempt; };
  if (std::any_of(sc.steps.begin(), sc.steps.end(), is_preempt)) {
    Scenario v = sc;
    std::erase_if(v.steps, is_preempt);
    out.push_back(std::move(v));
  }
  if (!sc.cache.layer_windows.empty()) {
    Scenario v = sc;
    v.cache.layer_windows.clear();
    out.push_back(std::move(v));
  }
  const auto is_verify = [](const scenarios::Step& s) { return s.kind == StepKind::kVerify; };
  if (std::any_of(sc.steps.begin(), sc.steps.end(), is_verify)) {
    Scenario v = sc;
    std::vector<scenarios::Step> steps;
    std::map<std::int64_t, bool> pending;  // request -> a verify turned into a decode awaits its accept
    for (const scenarios::Step& s : v.steps) {
      if (s.kind == StepKind::kVerify) {
        steps.push_back(scenarios::Step{StepKind::kDecode, s.request});
        pending[s.request] = true;
      } else if (s.kind == StepKind::kAccept && pending[s.request]) {
        pending[s.request] = false;
      } else {
        if (s.kind == StepKind::kFinish || s.kind == StepKind::kReset || s.kind == StepKind::kTrim ||
            s.kind == StepKind::kPreempt)
          pending[s.request] = false;
        steps.push_back(s);
      }
    }
    v.steps = std::move(steps);
    out.push_back(std::move(v));
  }
  // Drop a shared prefix (the request writes its own rows from 0), or share one position fewer.
  for (std::size_t r = 0; r < sc.requests.size(); ++r) {
    if (!sc.requests[r].prefix) continue;
    Scenario v = sc;
    v.requests[r].prefix.reset();
    out.push_back(std::move(v));
    if (sc.requests[r].prefix->positions > 1) {
      Scenario w = sc;
      w.requests[r].prefix->positions -= 1;
      out.push_back(std::move(w));
    }
  }
  // Drop one step, or a verify together with its accept.
  for (std::size_t i = 0; i < sc.steps.size(); ++i) {
    Scenario v = sc;
    v.steps.erase(v.steps.begin() + static_cast<std::ptrdiff_t>(i));
    out.push_back(v);
    if (sc.steps[i].kind == StepKind::kVerify) {
      // This verify alone as a decode (its accept dropped).
      for (std::size_t j = i + 1; j < sc.steps.size(); ++j) {
        if (sc.steps[j].request == sc.steps[i].request && sc.steps[j].kind == StepKind::kAccept) {
          Scenario w = sc;
          w.steps.erase(w.steps.begin() + static_cast<std::ptrdiff_t>(j));
          w.steps[i] = scenarios::Step{StepKind::kDecode, sc.steps[i].request};
          out.push_back(std::move(w));
          break;
        }
      }
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
    if (s.kind == StepKind::kTrim && s.positions > 1) {
      Scenario v = sc;
      v.steps[i].positions -= 1;
      out.push_back(std::move(v));
    }
  }
  // Simpler cache: fewer layers, fewer heads, narrower heads, exact rows, no RoPE.
  auto with = [&](auto&& edit) {
    Scenario v = sc;
    edit(v.cache);
    out.push_back(std::move(v));
  };
  // Fewer layers, dropped from the end (with their windows and rows): one,
  // half, one fewer. A failure between layers (one pool across them) needs
  // two, and two are what it keeps.
  if (sc.cache.layers > 1) {
    const std::int32_t n = sc.cache.layers;
    std::int32_t last = 0;
    for (const std::int32_t keep : {1, n / 2, n - 1}) {
      if (keep <= last) continue;  // each once (three layers: 1, 1, 2)
      out.push_back(without_layers(sc, keep, n));
      last = keep;
    }
  }
  // A narrower window, the ring kept (a ring safe for a window is safe for
  // a narrower one): a failure that needs many rows then needs fewer steps.
  if (sc.cache.window > 1) {
    with([](auto& c) { c.window /= 2; });
    with([](auto& c) { c.window -= 1; });
  }
  // One state fewer, where no request holds the last one.
  if (sc.cache.states > 1 && std::all_of(sc.requests.begin(), sc.requests.end(), [&sc](const scenarios::Request& r) {
        return r.state < sc.cache.states - 1;
      }))
    with([](auto& c) { c.states -= 1; });
  // One layer fewer from anywhere, its window with it: a case needs only the
  // layers whose windows differ where it fails, or the two layers of one
  // pool that collide (the last one dropped above).
  if (sc.cache.layers > 1) {
    for (std::int32_t l = 0; l + 1 < sc.cache.layers; ++l) out.push_back(without_layers(sc, l, l + 1));
  }
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

std::uint64_t case_seed(std::uint64_t seed, std::int64_t index) {
  return mix_seed(seed, static_cast<std::uint64_t>(index));
}

std::uint64_t check_case_seed(const CheckOptions& options, std::int64_t index) {
  return options.only_case_seed ? *options.only_case_seed : case_seed(options.seed, index);
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

/// The second cache's provider of a side-by-side check (--against); null
/// for --repeat-bitwise (the first cache's provider serves both runs) and
/// for a check of one cache.
std::unique_ptr<engines::CacheProvider> new_second_provider(const CheckOptions& options) {
  if (options.run.against.empty()) return nullptr;
  if (!options.against_provider_factory) return make_provider(second_run(options.run));
  std::unique_ptr<engines::CacheProvider> made = options.against_provider_factory();
  if (!made) throw Error(ErrorId::kUsage, "against_provider_factory", "the provider factory returned no provider");
  return made;
}

/// What the check's cases are drawn inside: the cache's capabilities, or
/// what both caches of a side-by-side check can run.
engines::Capabilities check_capabilities(engines::CacheProvider& first, engines::CacheProvider* second) {
  return second ? intersect_capabilities(first.capabilities(), second->capabilities()) : first.capabilities();
}

/// One case on the check's cache, or (side by side) on both caches,
/// compared: `second` null runs the first cache's provider twice. `kept`
/// receives both runs when given.
RunObservation run_case(const Scenario& sc, const RunOptions& run, engines::CacheProvider& first,
                        engines::CacheProvider* second, PairRun* kept = nullptr) {
  if (!runs_side_by_side(run)) {
    RunOptions one = run;
    one.provider = &first;
    return run_scenario(sc, one);
  }
  PairRun pair = run_pair(sc, run, first, second ? *second : first);
  RunObservation summary = std::move(pair.summary);
  if (kept) *kept = std::move(pair);
  return summary;
}

/// Sorts `values` and keeps the lowest `n`.
void keep_lowest(std::vector<std::int64_t>* values, std::size_t n) {
  std::sort(values->begin(), values->end());
  if (values->size() > n) values->resize(n);
}

CaseTally run_cases_with(const CheckOptions& options, engines::CacheProvider& main_provider,
                         engines::CacheProvider* main_second) {
  const Shard shard = options.shard;
  KVCHECK_ASSERT(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count);
  const std::int64_t total = std::max<std::int64_t>(options.cases, 0);
  // This shard's cases: index = shard.index + k * shard.count.
  const std::int64_t mine = shard.index < total ? (total - shard.index + shard.count - 1) / shard.count : 0;
  const auto case_index = [&shard](std::int64_t k) { return shard.index + k * shard.count; };
  const int threads = std::max(1, options.threads);
  // The coordinating provider's capabilities steer the generator.
  const engines::Capabilities caps = check_capabilities(main_provider, main_second);
  const bool side_by_side = runs_side_by_side(options.run);
  CaseTally tally;
  tally.cases = mine;
  tally.reachable = reachable_coverage(caps, options.profile);
  tally.kernel_paths = caps.kernel_paths;
  const std::size_t classes = tally.reachable.size();

  // What one case adds to the tally.
  struct CaseRecord {
    bool failed = false;
    bool skipped = false;
    bool refused = false;
    bool crash_not_reproduced = false;
    std::int64_t queries = 0;
    std::int64_t not_output_checked = 0;
    ComparedCounts compared;
    std::vector<bool> flags;  ///< coverage flags; of a skipped or refused case, what it was drawn with
    BlockCounts blocks;
  };
  // Results are added up as cases finish (sums commute, so the tally does
  // not depend on which worker ran what): nothing is sized by the case
  // count. With --max-failures cases are counted in case order instead
  // (`pending` holds those that finished ahead of a lower one), so the
  // stop falls after the same case whatever the threads.
  std::mutex tally_mutex;
  std::map<std::int64_t, CaseRecord> pending;  // guarded by tally_mutex
  std::int64_t counted = 0;                    // guarded: with max_failures, cases 0..counted-1 counted
  std::vector<std::int64_t> lowest_failing;    // guarded: the lowest failing k, ascending
  std::vector<std::int64_t> failing;           // guarded: failing k, the lowest kListedFailingCases kept
  tally.coverage_counts.assign(classes, 0);
  tally.coverage_refused.assign(classes, 0);
  std::atomic<bool> stopped{false};
  const auto count = [&](std::int64_t k, const CaseRecord& r) {  // under tally_mutex
    if (r.skipped) {
      ++(r.refused ? tally.refused : tally.skipped);
    } else {
      tally.queries += r.queries;
      tally.queries_not_output_checked += r.not_output_checked;
      tally.block_window_frees += r.blocks.window_frees;
      tally.block_end_frees += r.blocks.end_frees;
      tally.block_reuses += r.blocks.reuses;
    }
    // What the cache would not take counts apart: a class it refuses
    // whenever it is drawn is not gated (finish_with).
    std::vector<std::int64_t>& counts = r.skipped ? tally.coverage_refused : tally.coverage_counts;
    for (std::size_t c = 0; c < classes; ++c) counts[c] += r.flags[c] ? 1 : 0;
    tally.compared += r.compared;
    tally.crashes_not_reproduced += r.crash_not_reproduced ? 1 : 0;
    if (r.failed) {
      ++tally.failures;
      lowest_failing.insert(std::upper_bound(lowest_failing.begin(), lowest_failing.end(), k), k);
      if (lowest_failing.size() > kShrunkFailingCases) lowest_failing.pop_back();
      failing.push_back(k);
      if (failing.size() >= 2 * kListedFailingCases) keep_lowest(&failing, kListedFailingCases);
    }
  };
  const auto record = [&](std::int64_t k, CaseRecord r) {
    const std::lock_guard<std::mutex> lock(tally_mutex);
    if (options.max_failures <= 0) return count(k, r);
    if (stopped.load()) return;  // after the stop: dropped
    pending.emplace(k, std::move(r));
    while (!stopped.load() && !pending.empty() && pending.begin()->first == counted) {
      count(counted, pending.begin()->second);
      pending.erase(pending.begin());
      ++counted;
      if (tally.failures >= options.max_failures) stopped.store(true);
    }
  };
  std::atomic<std::int64_t> next{0}, done{0};
  std::atomic<std::int64_t> first_failure{mine};                              // in this shard's numbering k
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));  // read after join only
  std::atomic<bool> worker_failed{false};
  // What ran before the lowest failing case in its worker's provider, so a
  // failure that does not fail alone can be reproduced (finish_with).
  std::mutex first_failure_mutex;
  std::vector<std::int64_t> first_failure_earlier;  // guarded by first_failure_mutex
  std::int64_t first_failure_earlier_run = 0;       // guarded
  std::string first_failure_text;                   // guarded

  auto worker = [&](int id) {
    try {
      RunOptions run = options.run;
      run.record_reads = false;
      run.record_ring = false;
      std::unique_ptr<engines::CacheProvider> provider, second;
      // The cases this worker's provider ran, oldest first (the last
      // kKeptEarlierCases); a worker's case indices only grow, so once one
      // of its cases failed no later one can be the lowest failure.
      std::deque<std::int64_t> earlier;
      std::int64_t earlier_run = 0;
      for (;;) {
        if (stopped.load()) break;
        const std::int64_t k = next.fetch_add(1);
        if (k >= mine) break;
        const std::int64_t i = case_index(k);
        if (!provider) {
          provider = new_provider(options);
          second = new_second_provider(options);
          run.provider = provider.get();
        }
        const Scenario sc = generate_scenario(check_case_seed(options, i), caps, options.profile);
        RunObservation obs;
        PairRun pair;
        try {
          obs = run_case(sc, run, *provider, second.get(), side_by_side ? &pair : nullptr);
        } catch (const Error& e) {
          // Name the case, so the failing schedule can be regenerated.
          throw Error(e.id(), e.where(),
                      e.rule() + "\n(check case " + std::to_string(i) + ", case seed " +
                          std::to_string(check_case_seed(options, i)) + ")");
        }
        CaseRecord r;
        if (obs.crashed) {
          // A crash is a failure only if the case fails again: it runs once
          // more alone, on a fresh provider (a new adapter process), which
          // the cases after it then share.
          provider = new_provider(options);
          run.provider = provider.get();
          earlier.clear();
          earlier_run = 0;
          RunObservation again = run_scenario(sc, run);
          if (again.passed || again.skipped) {
            r.crash_not_reproduced = true;
            obs = std::move(again);
          } else if (again.crashed) {
            provider.reset();  // spent: the next case starts a new one
          }
        }
        if (side_by_side) r.compared = pair.comparison.counts;
        r.skipped = obs.skipped;
        r.refused = obs.refused;
        if (obs.skipped) {
          r.flags = coverage_flags(classify(sc, caps));
        } else {
          r.queries = obs.queries;
          r.not_output_checked = obs.queries_not_output_checked;
          Coverage cov = classify(sc, caps);
          // Side by side the summary carries no slots: the first cache's run does.
          r.blocks = classify_blocks(sc, side_by_side ? pair.a : obs, caps.block_size, &cov);
          classify_cached(side_by_side ? pair.a : obs, &cov);
          r.flags = coverage_flags(cov);
        }
        r.failed = !obs.passed;
        if (r.failed) {
          const std::lock_guard<std::mutex> lock(first_failure_mutex);
          if (k < first_failure.load()) {
            first_failure.store(k);
            first_failure_earlier.assign(earlier.begin(), earlier.end());
            first_failure_earlier_run = earlier_run;
            first_failure_text = obs.first_failure;
          }
        }
        record(k, std::move(r));
        earlier.push_back(i);
        if (earlier.size() > kKeptEarlierCases) earlier.pop_front();
        ++earlier_run;
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
    if (worker_failed.load() || stopped.load()) break;
    if (options.progress) options.progress(done.load(), mine);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : pool) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  if (options.progress) options.progress(mine, mine);

  if (stopped.load()) {
    // Counted: the cases up to the max_failures-th failing one; the rest
    // did not run (or ran and were dropped).
    tally.cases = counted;
    tally.cases_not_run = mine - counted;
  }
  tally.block_size = caps.block_size;
  tally.observed = observed_name(caps);
  keep_lowest(&failing, kListedFailingCases);
  for (const std::int64_t k : failing) tally.failing_cases.push_back(case_index(k));
  if (first_failure.load() < mine) {
    tally.first_failing_case = case_index(first_failure.load());
    for (const std::int64_t k : lowest_failing) tally.lowest_failing_cases.push_back(case_index(k));
    tally.earlier_cases = std::move(first_failure_earlier);
    tally.earlier_cases_run = first_failure_earlier_run;
    tally.first_failure = std::move(first_failure_text);
  }
  return tally;
}

CheckResult finish_with(const CheckOptions& options, const CaseTally& tally,
                        const std::function<engines::CacheProvider&()>& main_provider) {
  CheckResult result;
  result.cases = tally.cases;
  result.failures = tally.failures;
  result.skipped = tally.skipped;
  result.refused = tally.refused;
  result.queries = tally.queries;
  result.queries_not_output_checked = tally.queries_not_output_checked;
  result.crashes_not_reproduced = tally.crashes_not_reproduced;
  result.cases_not_run = tally.cases_not_run;
  result.compared = tally.compared;
  result.observed = tally.observed;
  for (const std::int64_t i : tally.failing_cases) result.failing_case_seeds.push_back(check_case_seed(options, i));
  // A check where most cases never ran judged little: it fails (README
  // "Counts"). Compared in doubles: min_run_share is a fraction in [0, 1].
  result.run_share_ok =
      static_cast<double>(result.ran()) >= options.min_run_share * static_cast<double>(result.cases);
  result.coverage_counts = tally.coverage_counts;
  result.block_size = tally.block_size;
  result.block_window_frees = tally.block_window_frees;
  result.block_end_frees = tally.block_end_frees;
  result.block_reuses = tally.block_reuses;
  result.reachable = tally.reachable;
  result.coverage_refused = tally.coverage_refused;
  result.coverage_refused.resize(result.coverage_counts.size(), 0);
  const auto& gate_cases = coverage_gate_cases();
  result.kernel_paths = tally.kernel_paths;
  for (std::size_t k = 0; k < result.coverage_counts.size(); ++k) {
    // A check stopped by --max-failures has failed: the classes of the
    // cases it did not run are not judged.
    std::int64_t minimum = result.reachable[k] && options.coverage_gate && result.cases_not_run == 0 ? 1 : 0;
    if (k < gate_cases.size() && result.cases < gate_cases[k]) minimum = 0;
    // Drawn, and refused by the cache every time: what it accepts decides.
    if (result.coverage_counts[k] == 0 && result.coverage_refused[k] > 0) minimum = 0;
    result.coverage_minimums.push_back(minimum);
    result.coverage_ok = result.coverage_ok && result.coverage_counts[k] >= minimum;
  }
  if (tally.first_failing_case < 0) return result;

  engines::CacheProvider& provider = main_provider();
  result.found_failure = true;
  result.failing_case_seed = check_case_seed(options, tally.first_failing_case);
  const bool side_by_side = runs_side_by_side(options.run);
  const std::unique_ptr<engines::CacheProvider> main_second = new_second_provider(options);
  const engines::Capabilities caps = check_capabilities(provider, main_second.get());
  result.original = generate_scenario(result.failing_case_seed, caps, options.profile);
  // Runs as the check's workers ran them (no reads or ring kept), and as
  // the reported run is made (everything kept).
  RunOptions quiet = options.run;
  quiet.record_reads = false;
  quiet.record_ring = false;
  RunOptions final_run = options.run;
  const auto fails = [](const RunObservation& obs) { return !obs.passed && !obs.skipped; };
  const std::string what = side_by_side ? side_by_side_property(options.run)
                           : options.run.fault != "none"
                               ? options.run.fault
                               : options.run.backend.substr(0, options.run.backend.find(':'));
  const std::string check_command =
      "`kvcheck check " + case_arguments(options) + "`";
  result.shrunk.name = "counterexample-" + what + "-seed" + std::to_string(options.seed);

  // Every reported failure reproduces: the case as drawn is replayed alone
  // in a fresh cache (a new provider: a new adapter process for exec)
  // before anything is shrunk or reported.
  const auto say = [&options](const std::string& what) {
    if (options.activity) options.activity(what);
  };
  // The activity ends with the work, however it returns: "" says so.
  struct EndActivity {
    const CheckOptions& options;
    ~EndActivity() {
      if (options.activity) options.activity("");
    }
  } end_activity{options};
  const std::string seed_text = "case seed " + std::to_string(result.failing_case_seed);
  say("running " + seed_text + " again alone in a fresh cache");
  RunObservation alone;
  PairRun pair_alone;
  {
    const std::unique_ptr<engines::CacheProvider> fresh = new_provider(options);
    const std::unique_ptr<engines::CacheProvider> fresh_second = new_second_provider(options);
    alone = run_case(result.original, final_run, *fresh, fresh_second.get(), &pair_alone);
  }
  // Side by side, the reported runs are the first cache's and the second's.
  const auto keep_pair = [&result](PairRun& pair) {
    result.difference = std::move(pair.comparison);
    result.shrunk_run_b = std::move(pair.b);
    return std::move(pair.a);
  };
  if (fails(alone)) {
    Scenario shrunk = shrink_scenario(
        result.original,
        [&](const Scenario& s) {
          say("shrinking " + seed_text + ": " + std::to_string(result.shrink_runs) + " runs, " +
              std::to_string(s.steps.size()) + " steps");
          return fails(run_case(s, quiet, provider, main_second.get()));
        },
        &result.shrink_runs);
    say("running the shrunk case again in a fresh cache");
    shrunk.name = result.shrunk.name;
    shrunk.description =
        "Shrunk from case seed " + std::to_string(result.failing_case_seed) + " of " + check_command;
    // The shrunk case is replayed in a fresh cache too: shrinking ran every
    // variant in one cache, whose leftovers may have steered it.
    const std::unique_ptr<engines::CacheProvider> fresh = new_provider(options);
    const std::unique_ptr<engines::CacheProvider> fresh_second = new_second_provider(options);
    PairRun pair_shrunk;
    RunObservation shrunk_run = run_case(shrunk, final_run, *fresh, fresh_second.get(), &pair_shrunk);
    if (fails(shrunk_run)) {
      result.shrunk = std::move(shrunk);
      result.shrunk_run = side_by_side ? keep_pair(pair_shrunk) : std::move(shrunk_run);
      // Still large: the next lowest failing cases are shrunk too (each
      // failing alone in a fresh cache first, its shrunk case again), and
      // the smallest counterexample is kept, named by its own case seed.
      const auto large = [](const Scenario& sc) {
        return sc.steps.size() > kSmallCounterexampleSteps || sc.requests.size() > kSmallCounterexampleRequests;
      };
      const auto smaller = [](const Scenario& a, const Scenario& b) {
        return std::make_pair(a.steps.size(), a.requests.size()) < std::make_pair(b.steps.size(), b.requests.size());
      };
      for (const std::int64_t index : tally.lowest_failing_cases) {
        if (!large(result.shrunk)) break;
        if (index == tally.first_failing_case) continue;
        const std::uint64_t seed = check_case_seed(options, index);
        const Scenario drawn = generate_scenario(seed, caps, options.profile);
        say("case seed " + std::to_string(result.failing_case_seed) + " shrank to " +
            std::to_string(result.shrunk.steps.size()) + " steps: shrinking case seed " + std::to_string(seed));
        {
          const std::unique_ptr<engines::CacheProvider> again = new_provider(options);
          const std::unique_ptr<engines::CacheProvider> again_second = new_second_provider(options);
          if (!fails(run_case(drawn, quiet, *again, again_second.get()))) continue;
        }
        Scenario other = shrink_scenario(
            drawn, [&](const Scenario& s) { return fails(run_case(s, quiet, provider, main_second.get())); },
            &result.shrink_runs);
        if (!smaller(other, result.shrunk)) continue;
        const std::unique_ptr<engines::CacheProvider> again = new_provider(options);
        const std::unique_ptr<engines::CacheProvider> again_second = new_second_provider(options);
        PairRun pair_other;
        RunObservation other_run = run_case(other, final_run, *again, again_second.get(), &pair_other);
        if (!fails(other_run)) continue;
        other.name = result.shrunk.name;
        other.description = "Shrunk from case seed " + std::to_string(seed) + " of " + check_command +
                            " (the smallest of the lowest failing cases' counterexamples; the first, case seed " +
                            std::to_string(result.failing_case_seed) + ", shrank to " +
                            std::to_string(result.shrunk.steps.size()) + " steps)";
        result.failing_case_seed = seed;
        result.original = drawn;
        result.shrunk = std::move(other);
        result.shrunk_run = side_by_side ? keep_pair(pair_other) : std::move(other_run);
      }
    } else {
      const std::string name = result.shrunk.name;
      result.shrunk = result.original;
      result.shrunk.name = name;
      result.shrunk.description =
          "Case seed " + std::to_string(result.failing_case_seed) + " of " + check_command +
          ", as drawn: its shrunk variants fail only after other variants in one cache";
      result.shrunk_run = side_by_side ? keep_pair(pair_alone) : std::move(alone);
    }
    return result;
  }

  // It passes alone: the failure depends on the cases that ran before it in
  // its process (state kept across close/open). Not shrunk (the property
  // does not hold of the case alone); the shortest kept tail of the earlier
  // cases that makes it fail again in a fresh cache is kept with it, tried
  // 1, 2, 4, ... cases long (at most about 2 * kKeptEarlierCases runs).
  result.reproduces_alone = false;
  result.earlier_cases_run = tally.earlier_cases_run;
  result.first_failure_there = tally.first_failure;
  const std::string name = result.shrunk.name;
  result.shrunk = result.original;
  result.shrunk.name = name;
  result.shrunk.description = "Case seed " + std::to_string(result.failing_case_seed) + " of " +
                              check_command +
                              ", as drawn: it failed after earlier cases in one process and passes alone";
  result.shrunk_run = side_by_side ? keep_pair(pair_alone) : alone;
  // Side by side, the cases before it are not searched: the difference is
  // reported as drawn, with the first difference there.
  if (side_by_side) return result;
  const std::vector<std::int64_t>& kept = tally.earlier_cases;
  std::size_t tail = 0;
  for (std::size_t length = 1; !kept.empty(); length *= 2) {
    length = std::min(length, kept.size());
    say(seed_text + " passes alone: running it after the " + std::to_string(length) + " case(s) before it");
    const std::unique_ptr<engines::CacheProvider> fresh = new_provider(options);
    quiet.provider = fresh.get();
    final_run.provider = fresh.get();
    for (std::size_t j = kept.size() - length; j < kept.size(); ++j) {
      run_scenario(generate_scenario(check_case_seed(options, kept[j]), caps, options.profile), quiet);
    }
    RunObservation after = run_scenario(result.shrunk, final_run);
    tail = length;
    result.shrunk_run = std::move(after);
    if (fails(result.shrunk_run)) {
      result.reproduces_after_earlier = true;
      break;
    }
    if (length == kept.size()) break;
  }
  for (std::size_t j = kept.size() - tail; j < kept.size(); ++j) {
    const std::uint64_t seed = check_case_seed(options, kept[j]);
    Scenario earlier = generate_scenario(seed, caps, options.profile);
    earlier.description = "Case seed " + std::to_string(seed) + " of " + check_command +
                          ", which ran before case seed " + std::to_string(result.failing_case_seed) +
                          " in its process";
    result.earlier_case_seeds.push_back(seed);
    result.earlier_cases.push_back(std::move(earlier));
  }
  return result;
}

}  // namespace

CaseTally run_cases(const CheckOptions& options) {
  const std::unique_ptr<engines::CacheProvider> main_provider = new_provider(options);
  const std::unique_ptr<engines::CacheProvider> main_second = new_second_provider(options);
  return run_cases_with(options, *main_provider, main_second.get());
}

CaseTally merge_tallies(const std::vector<CaseTally>& shards) {
  CaseTally total;
  total.reachable =
      shards.empty() ? std::vector<bool>(coverage_names().size(), true) : shards.front().reachable;
  total.coverage_counts.assign(total.reachable.size(), 0);
  total.coverage_refused.assign(total.reachable.size(), 0);
  if (!shards.empty()) total.kernel_paths = shards.front().kernel_paths;
  for (const CaseTally& t : shards) {
    KVCHECK_ASSERT(t.reachable == total.reachable &&
                   t.coverage_counts.size() == total.coverage_counts.size());
    total.cases += t.cases;
    total.failures += t.failures;
    total.skipped += t.skipped;
    total.refused += t.refused;
    total.queries += t.queries;
    total.queries_not_output_checked += t.queries_not_output_checked;
    total.crashes_not_reproduced += t.crashes_not_reproduced;
    total.compared += t.compared;
    for (std::size_t k = 0; k < t.coverage_counts.size(); ++k)
      total.coverage_counts[k] += t.coverage_counts[k];
    for (std::size_t k = 0; k < t.coverage_refused.size() && k < total.coverage_refused.size(); ++k)
      total.coverage_refused[k] += t.coverage_refused[k];
    total.block_size = std::max(total.block_size, t.block_size);
    total.block_window_frees += t.block_window_frees;
    total.block_end_frees += t.block_end_frees;
    total.block_reuses += t.block_reuses;
    total.failing_cases.insert(total.failing_cases.end(), t.failing_cases.begin(), t.failing_cases.end());
    if (total.observed.empty()) total.observed = t.observed;
    if (t.first_failing_case >= 0 &&
        (total.first_failing_case < 0 || t.first_failing_case < total.first_failing_case)) {
      total.first_failing_case = t.first_failing_case;
      total.lowest_failing_cases = t.lowest_failing_cases;
      total.earlier_cases = t.earlier_cases;
      total.earlier_cases_run = t.earlier_cases_run;
      total.first_failure = t.first_failure;
    }
  }
  keep_lowest(&total.failing_cases, kListedFailingCases);
  return total;
}

bool case_fails_alone(const CheckOptions& options, std::int64_t case_index) {
  const std::unique_ptr<engines::CacheProvider> fresh = new_provider(options);
  const std::unique_ptr<engines::CacheProvider> fresh_second = new_second_provider(options);
  RunOptions run = options.run;
  run.record_reads = false;
  run.record_ring = false;
  const Scenario sc = generate_scenario(check_case_seed(options, case_index),
                                        check_capabilities(*fresh, fresh_second.get()), options.profile);
  const RunObservation obs = run_case(sc, run, *fresh, fresh_second.get());
  return !obs.passed && !obs.skipped;
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
  const std::unique_ptr<engines::CacheProvider> main_second = new_second_provider(options);
  const CaseTally tally = run_cases_with(whole, *main_provider, main_second.get());
  return finish_with(whole, tally, [&]() -> engines::CacheProvider& { return *main_provider; });
}

}  // namespace kvcheck::properties
