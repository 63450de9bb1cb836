#include "properties/generator.hpp"

#include <algorithm>
#include <map>

#include "properties/runner.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/prng.hpp"

namespace kvcheck::properties {

namespace {

using scenarios::Order;
using scenarios::Scenario;
using scenarios::Step;
using scenarios::StepKind;

enum Kind { kPrefillLts, kPrefillStl, kDecode, kVerify, kFinish, kReset, kKinds };

/// Picks an index with probability proportional to its weight (sum > 0).
int pick(Prng& rng, const int (&weights)[kKinds]) {
  int total = 0;
  for (const int w : weights) total += w;
  auto r = static_cast<int>(rng.below(static_cast<std::uint64_t>(total)));
  for (int i = 0; i < kKinds; ++i) {
    if (r < weights[i]) return i;
    r -= weights[i];
  }
  return kDecode;
}

}  // namespace

std::vector<std::string> coverage_names() {
  return {"ring_wrap", "verify_rejection", "chunk_longer_than_window", "state_reuse"};
}

std::vector<bool> coverage_flags(const Coverage& c) {
  return {c.ring_wrap, c.verify_rejection, c.chunk_longer_than_window, c.state_reuse};
}

std::vector<bool> reachable_coverage(const engines::Capabilities& caps) {
  const bool prefill = caps.prefill_load_then_store || caps.prefill_store_then_load;
  return {!caps.full_window_only, caps.verify, prefill && !caps.full_window_only, caps.finish};
}

Scenario generate_scenario(std::uint64_t seed, const engines::Capabilities& caps) {
  Prng rng(seed);
  Scenario sc;
  sc.name = "generated-" + std::to_string(seed);
  sc.description = "kvcheck check case drawn from seed " + std::to_string(seed);
  sc.data.seed = rng.next() >> 1;

  // Swarm: which step kinds are on, and their weights (some zero).
  int weights[kKinds];
  for (int& w : weights) w = rng.chance(2, 3) ? static_cast<int>(rng.range(1, 4)) : 0;
  if (weights[kPrefillLts] + weights[kPrefillStl] + weights[kDecode] + weights[kVerify] == 0) {
    weights[kDecode] = 2;
  }
  weights[kFinish] = std::min(weights[kFinish], 1);
  weights[kReset] = std::min(weights[kReset], 1);
  // Only what the cache runs (no extra draws, so a full-featured cache keeps its cases).
  if (!caps.prefill_load_then_store) weights[kPrefillLts] = 0;
  if (!caps.prefill_store_then_load) weights[kPrefillStl] = 0;
  if (!caps.decode) weights[kDecode] = 0;
  if (!caps.verify) weights[kVerify] = 0;
  if (!caps.finish) weights[kFinish] = 0;
  if (!caps.reset) weights[kReset] = 0;
  if (weights[kPrefillLts] + weights[kPrefillStl] + weights[kDecode] + weights[kVerify] == 0) {
    if (caps.decode) weights[kDecode] = 2;
    else if (caps.prefill_load_then_store) weights[kPrefillLts] = 2;
    else if (caps.prefill_store_then_load) weights[kPrefillStl] = 2;
    else weights[kVerify] = 2;
  }

  auto& c = sc.cache;
  c.window = rng.range(1, 7);
  const std::uint64_t conv = rng.below(6);
  c.convention = conv < 4 ? scenarios::Convention::kKeys
                          : (conv == 4 ? scenarios::Convention::kLeft : scenarios::Convention::kOffByOne);
  const std::int64_t keys = window_keys(c);
  std::int64_t max_drafts = weights[kVerify] ? rng.range(1, 4) : 0;
  const bool prefill_on = weights[kPrefillLts] + weights[kPrefillStl] > 0;
  std::int64_t max_chunk = prefill_on ? rng.range(1, 2 * keys + 2) : 1;
  if (caps.max_step_rows > 0) {
    max_chunk = std::min(max_chunk, caps.max_step_rows);
    max_drafts = std::min(max_drafts, caps.max_step_rows - 1);
  }
  // Minimum safe ring for these bounds (SPEC §5), then 0..2 rows of slack.
  std::int64_t safe = std::max(keys + max_drafts, max_chunk);
  if (weights[kPrefillStl] > 0) safe = std::max(safe, keys + max_chunk - 1);
  const std::uint64_t slack_draw = rng.below(8);
  c.ring_rows = safe + (slack_draw < 5 ? 0 : static_cast<std::int64_t>(slack_draw) - 4);
  c.states = rng.range(1, 3);
  c.kv_heads = static_cast<std::int32_t>(rng.range(1, 2));
  c.q_heads = c.kv_heads * static_cast<std::int32_t>(rng.range(1, 2));
  c.shared_row = c.kv_heads == 1 && rng.chance(1, 4);
  c.head_dim = static_cast<std::int32_t>(2 << rng.below(3));  // 2, 4, 8
  const std::uint64_t fmt = rng.below(8);
  c.format = fmt < 4 ? scenarios::Format::kF64
                     : static_cast<scenarios::Format>(static_cast<int>(fmt) - 4);
  if (rng.chance(2, 3)) {
    c.rope.style = rng.chance(1, 2) ? scenarios::RopeStyle::kNeox : scenarios::RopeStyle::kInterleaved;
    c.rope.rotary_dims = static_cast<std::int32_t>(2 * rng.range(1, c.head_dim / 2));
    c.rope.base = rng.chance(1, 2) ? 10000.0 : 100.0;
  }
  c.layers = rng.chance(1, 6) ? 2 : 1;
  if (rng.chance(1, 6)) c.sink_logit = static_cast<double>(rng.range(-2, 2));
  // Fit the configuration to the cache (no extra draws).
  if (caps.max_states > 0) c.states = std::min(c.states, caps.max_states);
  if (!caps.gqa) c.q_heads = c.kv_heads;
  if (caps.max_heads > 0 && c.q_heads > caps.max_heads) c.q_heads = c.kv_heads = 1;
  if (!caps.shared_row) c.shared_row = false;
  if (caps.max_head_dim > 0) {
    while (c.head_dim > 2 && c.head_dim > caps.max_head_dim) c.head_dim /= 2;
  }
  if (std::find(caps.formats.begin(), caps.formats.end(), c.format) == caps.formats.end() && !caps.formats.empty()) {
    c.format = caps.formats.front();
  }
  if (std::find(caps.rope_styles.begin(), caps.rope_styles.end(), c.rope.style) == caps.rope_styles.end()) {
    c.rope = scenarios::Rope{};
  }
  c.rope.rotary_dims = std::min(c.rope.rotary_dims, c.head_dim);
  if (!caps.partial_rope && c.rope.style != scenarios::RopeStyle::kNone) c.rope.rotary_dims = c.head_dim;
  if (caps.max_layers > 0) c.layers = static_cast<std::int32_t>(std::min<std::int64_t>(c.layers, caps.max_layers));
  if (!caps.sink) c.sink_logit.reset();

  // Requests: 1..3, each with a state id; later requests may reuse a state.
  const std::int64_t request_count = rng.range(1, 3);
  for (std::int64_t r = 0; r < request_count; ++r) {
    sc.requests.push_back({r, static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(c.states)))});
  }

  struct Live {
    bool started = false, finished = false;
    scenarios::RequestProgress progress;
  };
  std::vector<Live> live(static_cast<std::size_t>(request_count));
  std::map<std::int64_t, std::int64_t> holder;  // state -> active request
  const std::int64_t budget = rng.range(4, 16);
  for (std::int64_t s = 0; s < budget; ++s) {
    // Requests that may take a step now.
    std::vector<std::int64_t> ready;
    for (std::int64_t r = 0; r < request_count; ++r) {
      const Live& l = live[static_cast<std::size_t>(r)];
      if (l.finished) continue;
      const std::int64_t state = sc.requests[static_cast<std::size_t>(r)].state;
      const auto h = holder.find(state);
      if (l.started || h == holder.end()) ready.push_back(r);
    }
    if (ready.empty()) break;
    const std::int64_t r = ready[static_cast<std::size_t>(rng.below(ready.size()))];
    Live& l = live[static_cast<std::size_t>(r)];
    Step step;
    step.request = r;
    if (l.progress.pending()) {
      step.kind = StepKind::kAccept;
      step.accepted = rng.range(0, l.progress.pending_drafts);
    } else {
      const int kind = pick(rng, weights);
      switch (kind) {
        case kPrefillLts:
        case kPrefillStl:
          step.kind = StepKind::kPrefill;
          step.order = kind == kPrefillLts ? Order::kLoadThenStore : Order::kStoreThenLoad;
          // Long chunks are drawn often so windows fill and rings wrap.
          step.rows = rng.chance(1, 2) ? max_chunk : rng.range(1, max_chunk);
          break;
        case kDecode: step.kind = StepKind::kDecode; break;
        case kVerify:
          step.kind = StepKind::kVerify;
          step.drafts = rng.range(0, max_drafts);
          break;
        case kFinish: step.kind = l.started ? StepKind::kFinish : StepKind::kDecode; break;
        default: step.kind = l.started ? StepKind::kReset : StepKind::kDecode; break;
      }
    }
    if (!l.started) {
      l.started = true;
      holder[sc.requests[static_cast<std::size_t>(r)].state] = r;
    }
    if (step.kind == StepKind::kFinish) {
      l.finished = true;
      holder.erase(sc.requests[static_cast<std::size_t>(r)].state);
    }
    scenarios::advance(l.progress, step);
    sc.steps.push_back(step);
  }
  // Close a pending verify so every schedule ends in a committed state.
  for (std::int64_t r = 0; r < request_count; ++r) {
    if (live[static_cast<std::size_t>(r)].progress.pending()) {
      Step a;
      a.kind = StepKind::kAccept;
      a.request = r;
      a.accepted = rng.range(0, live[static_cast<std::size_t>(r)].progress.pending_drafts);
      sc.steps.push_back(a);
    }
  }
  // Requests that never ran are dropped so the file stays minimal.
  std::vector<scenarios::Request> used;
  for (const auto& req : sc.requests) {
    if (live[static_cast<std::size_t>(req.id)].started) used.push_back(req);
  }
  sc.requests = used;
  if (caps.full_window_only) {
    // A cache that attends to every row it holds: window and capacity cover
    // every position the schedule writes, so nothing ever slides or wraps.
    const std::int64_t end = scenarios::schedule_end(sc.steps);
    c.convention = scenarios::Convention::kKeys;
    c.window = c.ring_rows = end;
  }
  scenarios::validate_scenario(sc);
  return sc;
}

Coverage classify(const Scenario& sc) {
  Coverage cov;
  const std::int64_t keys = window_keys(sc.cache);
  std::map<std::int64_t, scenarios::RequestProgress> progress;
  std::map<std::int64_t, std::int64_t> state_of;
  for (const auto& r : sc.requests) state_of[r.id] = r.state;
  std::map<std::int64_t, bool> state_used, started;
  for (const auto& s : sc.steps) {
    if (!started[s.request]) {
      started[s.request] = true;
      const std::int64_t st = state_of[s.request];
      if (state_used[st]) cov.state_reuse = true;
      state_used[st] = true;
    }
    scenarios::RequestProgress& p = progress[s.request];
    const std::int64_t n = scenarios::step_rows(s);
    if (n > 0 && scenarios::step_first_position(p) + n - 1 >= sc.cache.ring_rows) cov.ring_wrap = true;
    if (s.kind == StepKind::kPrefill && s.rows > keys) cov.chunk_longer_than_window = true;
    if (s.kind == StepKind::kAccept && s.accepted < p.pending_drafts) cov.verify_rejection = true;
    scenarios::advance(p, s);
  }
  return cov;
}

}  // namespace kvcheck::properties
