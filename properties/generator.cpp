#include "properties/generator.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include "properties/runner.hpp"
#include "properties/value_profiles.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/prng.hpp"

namespace kvcheck::properties {

namespace {

using scenarios::Order;
using scenarios::Scenario;
using scenarios::Step;
using scenarios::StepKind;

// The swarm slots: one per row of KVCHECK_STEP_CAPABILITIES (scenarios/step_kinds.hpp),
// in table order (the order their weights are drawn); the names below are the
// slots the drawing policy treats specially.
using scenarios::StepCapability;
constexpr int kKinds = scenarios::kStepCapabilityCount;
constexpr int kPrefillLts = static_cast<int>(StepCapability::kPrefillLoadThenStore);
constexpr int kPrefillStl = static_cast<int>(StepCapability::kPrefillStoreThenLoad);
constexpr int kDecode = static_cast<int>(StepCapability::kDecode);
constexpr int kVerify = static_cast<int>(StepCapability::kVerify);
constexpr int kFinish = static_cast<int>(StepCapability::kFinish);
constexpr int kReset = static_cast<int>(StepCapability::kReset);
// Trim is drawn apart from the swarm (its own stream, under --profile trim):
// its slot is last and its weight stays 0 in the swarm's draws, so every
// other profile keeps its cases byte for byte.
constexpr int kTrim = static_cast<int>(StepCapability::kTrim);

/// Whether a slot's steps write rows.
constexpr bool slot_writes(int slot) noexcept {
  return scenarios::step_kind_writes_rows(scenarios::step_capability_info(static_cast<StepCapability>(slot)).kind);
}

/// Sum of the weights of the slots whose steps write rows.
int writing_weight(const int (&weights)[kKinds]) {
  int total = 0;
  for (int i = 0; i < kKinds; ++i) total += slot_writes(i) ? weights[i] : 0;
  return total;
}

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

std::string profile_name(Profile profile) {
  switch (profile) {
    case Profile::kDefault: return "default";
    case Profile::kProduction: return "production";
    case Profile::kTrim: return "trim";
    case Profile::kPaged: return "paged";
    case Profile::kLayers: return "layers";
    case Profile::kPrefix: return "prefix";
  }
  return "default";
}

bool parse_profile(const std::string& name, Profile* out) {
  if (name == "default")
    *out = Profile::kDefault;
  else if (name == "production")
    *out = Profile::kProduction;
  else if (name == "trim")
    *out = Profile::kTrim;
  else if (name == "paged")
    *out = Profile::kPaged;
  else if (name == "layers")
    *out = Profile::kLayers;
  else if (name == "prefix")
    *out = Profile::kPrefix;
  else
    return false;
  return true;
}

ProductionBudget production_budget() {
  // Measured on the 2-core VM at 113 bits: about 0.2 s a case on one core,
  // so 200 cases take well under a minute on two (README "Production profile").
  return ProductionBudget{450'000, 150'000, std::int64_t{48} << 20};
}

std::vector<std::string> coverage_names(Profile profile) {
  std::vector<std::string> names = {"ring_wrap", "verify_rejection", "chunk_longer_than_window",
                                    "state_reuse"};
  if (profile == Profile::kProduction) {
    for (const char* n :
         {"fast_cpu_kernel", "window_4096", "chunk_1024", "verify_8_drafts", "position_100k"}) {
      names.push_back(n);
    }
  }
  for (const char* n : {"verify_then_other_request", "finish_or_reset_with_drafts_pending"})
    names.push_back(n);
  if (profile == Profile::kTrim) {
    for (const char* n : {"write_after_trim", "trim_with_drafts_pending"}) names.push_back(n);
  }
  if (profile == Profile::kPaged) {
    for (const char* n : {"block_free", "block_reuse_after_free", "verify_straddles_block"}) names.push_back(n);
  }
  if (profile == Profile::kLayers) {
    for (const char* n : {"sliding_and_global_layers", "sliding_windows_differ"}) names.push_back(n);
  }
  if (profile == Profile::kPrefix) {
    for (const char* n :
         {"prefix_of_live", "prefix_of_finished", "cow_write_into_shared_block", "window_free_of_shared_block"})
      names.push_back(n);
  }
  return names;
}

std::vector<bool> coverage_flags(const Coverage& c, Profile profile) {
  std::vector<bool> flags = {c.ring_wrap, c.verify_rejection, c.chunk_longer_than_window, c.state_reuse};
  if (profile == Profile::kProduction) {
    for (const bool f :
         {c.fast_cpu_kernel, c.window_4096, c.chunk_1024, c.verify_8_drafts, c.position_100k}) {
      flags.push_back(f);
    }
  }
  flags.push_back(c.verify_then_other_request);
  flags.push_back(c.finish_or_reset_with_drafts_pending);
  if (profile == Profile::kTrim) {
    flags.push_back(c.write_after_trim);
    flags.push_back(c.trim_with_drafts_pending);
  }
  if (profile == Profile::kPaged) {
    for (const bool f : {c.block_free, c.block_reuse_after_free, c.verify_straddles_block}) flags.push_back(f);
  }
  if (profile == Profile::kLayers) {
    flags.push_back(c.sliding_and_global_layers);
    flags.push_back(c.sliding_windows_differ);
  }
  if (profile == Profile::kPrefix) {
    for (const bool f : {c.prefix_of_live, c.prefix_of_finished, c.cow_write_into_shared_block,
                         c.window_free_of_shared_block})
      flags.push_back(f);
  }
  // The cache's own kernel paths, last.
  flags.insert(flags.end(), c.kernel_paths.begin(), c.kernel_paths.end());
  return flags;
}

std::vector<std::string> coverage_names(Profile profile, const engines::Capabilities& caps) {
  std::vector<std::string> names = coverage_names(profile);
  names.insert(names.end(), caps.kernel_paths.begin(), caps.kernel_paths.end());
  return names;
}

std::vector<bool> reachable_coverage(const engines::Capabilities& caps, Profile profile) {
  const bool prefill = caps.prefill_load_then_store || caps.prefill_store_then_load;
  std::vector<bool> reach = {!caps.full_window_only, caps.verify, prefill && !caps.full_window_only,
                             caps.finish};
  if (profile == Profile::kProduction) {
    // A fast kernel of the cache's own, as it declares it (the CPU ring
    // pool's AVX-512 kernel, on a CPU that has AVX-512).
    reach.push_back(static_cast<bool>(caps.fast_kernel_runs));
    reach.push_back(!caps.full_window_only && (caps.max_window_keys == 0 || caps.max_window_keys >= 4096));
    reach.push_back(prefill && (caps.max_step_rows == 0 || caps.max_step_rows >= 1024) &&
                    (caps.max_positions == 0 || caps.max_positions >= 1024));
    reach.push_back(caps.verify && (caps.max_step_rows == 0 || caps.max_step_rows >= 9) &&
                    (caps.max_positions == 0 || caps.max_positions >= 9));
    reach.push_back(prefill && !caps.full_window_only &&
                    (caps.max_positions == 0 || caps.max_positions > 100'000 + 4096 + 4));
  }
  // Two requests live at once need two states; drafts end unaccepted by a finish or a reset.
  reach.push_back(caps.verify && (caps.max_states == 0 || caps.max_states >= 2));
  reach.push_back(caps.verify && (caps.finish || caps.reset));
  if (profile == Profile::kTrim) {
    reach.push_back(caps.trim);
    reach.push_back(caps.trim && caps.verify);
  }
  if (profile == Profile::kPaged) {
    // A cache with a block size: frees by its window (reached when one
    // slides); reuse seen in the slots it reports, on two states or a
    // finish; a straddling verify by its slots or positions.
    const bool paged = caps.block_size > 0;
    reach.push_back(paged && !caps.full_window_only);
    reach.push_back(paged && caps.reports_written_slots && caps.finish);
    reach.push_back(paged && caps.verify);
  }
  if (profile == Profile::kLayers) {
    const bool layered = caps.per_layer_windows && (caps.max_layers == 0 || caps.max_layers >= 2);
    reach.push_back(layered);
    reach.push_back(layered);
  }
  if (profile == Profile::kPrefix) {
    // Live sharing needs two states; a window frees a block only where one slides.
    const bool two = caps.max_states == 0 || caps.max_states >= 2;
    reach.push_back(caps.prefix_sharing && two);
    reach.push_back(caps.prefix_sharing && caps.finish);
    reach.push_back(caps.prefix_sharing);
    reach.push_back(caps.prefix_sharing && two && !caps.full_window_only);
  }
  // The cache's own kernel paths, last: gated where the profile draws the
  // shapes that take them (the production profile's head_dim 128 bf16/fp8
  // pools, batches and windows past one split); counted everywhere.
  reach.insert(reach.end(), caps.kernel_paths.size(), profile == Profile::kProduction);
  return reach;
}

namespace {

/// Swarm: which step kinds are on, and their weights (some zero), limited to
/// what the cache runs (no extra draws, so a full-featured cache keeps its cases).
void draw_weights(Prng& rng, const engines::Capabilities& caps, int (&weights)[kKinds]) {
  for (int i = 0; i < kKinds; ++i) {
    weights[i] = i != kTrim && rng.chance(2, 3) ? static_cast<int>(rng.range(1, 4)) : 0;
  }
  if (writing_weight(weights) == 0) weights[kDecode] = 2;
  // Steps that write nothing (finish, reset) at most weight 1, so rows get written.
  for (int i = 0; i < kKinds; ++i) {
    if (!slot_writes(i)) weights[i] = std::min(weights[i], 1);
  }
  for (int i = 0; i < kKinds; ++i) {
    if (!caps.runs(static_cast<StepCapability>(i))) weights[i] = 0;
  }
  if (writing_weight(weights) == 0) {
    if (caps.decode)
      weights[kDecode] = 2;
    else if (caps.prefill_load_then_store)
      weights[kPrefillLts] = 2;
    else if (caps.prefill_store_then_load)
      weights[kPrefillStl] = 2;
    else
      weights[kVerify] = 2;
  }
}

/// Chunk and draft bounds fitted to the cache's step-row limit.
void fit_step_bounds(const engines::Capabilities& caps, std::int64_t* max_chunk, std::int64_t* max_drafts) {
  if (caps.max_step_rows > 0) {
    *max_chunk = std::min(*max_chunk, caps.max_step_rows);
    *max_drafts = std::min(*max_drafts, caps.max_step_rows - 1);
  }
}

/// Minimum safe ring for these bounds (SPEC §5), before slack.
std::int64_t safe_ring_rows(std::int64_t keys, std::int64_t max_chunk, std::int64_t max_drafts,
                            bool store_then_load) {
  std::int64_t safe = std::max(keys + max_drafts, max_chunk);
  if (store_then_load) safe = std::max(safe, keys + max_chunk - 1);
  return safe;
}

/// Fits a drawn window to the cache's largest window (no extra draws; called
/// right after the window is drawn, as the ring and chunks follow from it).
void fit_window(scenarios::CacheConfig& c, const engines::Capabilities& caps) {
  if (caps.max_window_keys <= 0 || scenarios::declared_window_keys(c) <= caps.max_window_keys) return;
  if (c.convention == scenarios::Convention::kKeys) {
    c.window = caps.max_window_keys;
  } else if (caps.max_window_keys >= 2) {
    c.window = caps.max_window_keys - 1;  // left and off-by-one see W + 1 keys
  } else {
    c.convention = scenarios::Convention::kKeys;
    c.window = 1;
  }
}

/// Fits a drawn configuration to the cache (no extra draws).
void fit_to_caps(scenarios::CacheConfig& c, const engines::Capabilities& caps) {
  if (caps.max_states > 0) c.states = std::min(c.states, caps.max_states);
  if (!caps.gqa) c.q_heads = c.kv_heads;
  if (caps.max_heads > 0 && c.q_heads > caps.max_heads) c.q_heads = c.kv_heads = 1;
  // Fewer KV heads, same group size (halving keeps the production draws' powers of two).
  while (caps.max_kv_heads > 0 && c.kv_heads > caps.max_kv_heads) {
    const std::int32_t group = c.q_heads / c.kv_heads;
    c.kv_heads = std::max(1, c.kv_heads / 2);
    c.q_heads = c.kv_heads * group;
  }
  if (!caps.shared_row) c.shared_row = false;
  if (!caps.head_dims.contains(c.head_dim)) {
    // The declared size nearest the draw along halving and doubling (a cache
    // that runs multiples of 8 gets 8 where 2 or 4 were drawn), within the
    // largest head the profile draws; none fits: the draw stays (and is refused).
    if (const auto d = caps.head_dims.fit(c.head_dim, std::max<std::int64_t>(c.head_dim, 256))) {
      c.head_dim = static_cast<std::int32_t>(*d);
    }
  }
  if (std::find(caps.formats.begin(), caps.formats.end(), c.format) == caps.formats.end() &&
      !caps.formats.empty()) {
    c.format = caps.formats.front();
  }
  if (std::find(caps.rope_styles.begin(), caps.rope_styles.end(), c.rope.style) == caps.rope_styles.end()) {
    c.rope = scenarios::Rope{};
  }
  c.rope.rotary_dims = std::min(c.rope.rotary_dims, c.head_dim);
  if (!caps.partial_rope && c.rope.style != scenarios::RopeStyle::kNone) c.rope.rotary_dims = c.head_dim;
  if (c.rope.style != scenarios::RopeStyle::kNone && c.rope.rotary_dims > 0 &&
      !caps.rotary_dims.contains(c.rope.rotary_dims)) {
    // The nearest declared even width up to head_dim (the full width first
    // when partial RoPE is off); none: no rotation.
    std::optional<std::int64_t> r;
    const auto even_member = [&](std::int64_t x) {
      return x >= 2 && x % 2 == 0 && x <= c.head_dim && caps.rotary_dims.contains(x) &&
             (caps.partial_rope || x == c.head_dim);
    };
    for (std::int64_t x = c.rope.rotary_dims; x >= 2 && !r; x -= 2) {
      if (even_member(x)) r = x;
    }
    for (std::int64_t x = c.rope.rotary_dims + 2; x <= c.head_dim && !r; x += 2) {
      if (even_member(x)) r = x;
    }
    if (r) {
      c.rope.rotary_dims = static_cast<std::int32_t>(*r);
    } else {
      c.rope = scenarios::Rope{};
    }
  }
  if (caps.max_layers > 0)
    c.layers = static_cast<std::int32_t>(std::min<std::int64_t>(c.layers, caps.max_layers));
  if (!caps.sink) c.sink_logit.reset();
}

/// What is left of a production case's budget. Steps are charged what the
/// reference spends on them; a step that does not fit is shortened.
class WorkLeft {
 public:
  WorkLeft(const scenarios::CacheConfig& c, const ProductionBudget& b)
      : keys_(window_keys(c)),
        per_visible_row_(std::int64_t{c.q_heads} * c.head_dim * c.layers),
        per_row_(std::int64_t{c.kv_heads} * c.head_dim * c.layers),
        macs_(b.reference_macs),
        elements_(b.row_elements) {}

  /// How many of `rows` rows starting at position `first` fit (0..rows).
  std::int64_t fit(std::int64_t first, std::int64_t rows) const {
    std::int64_t macs = 0, elements = 0, n = 0;
    for (; n < rows; ++n) {
      macs += std::min(first + n + 1, keys_) * per_visible_row_;
      elements += per_row_;
      if (macs > macs_ || elements > elements_) break;
    }
    return n;
  }
  /// Spends the cost of `rows` rows starting at `first` (which must fit).
  void charge(std::int64_t first, std::int64_t rows) {
    for (std::int64_t n = 0; n < rows; ++n) {
      macs_ -= std::min(first + n + 1, keys_) * per_visible_row_;
      elements_ -= per_row_;
    }
  }

 private:
  std::int64_t keys_, per_visible_row_, per_row_, macs_, elements_;
};

/// The trim profile's draws: their own stream, and how far below the
/// highest row a request wrote (since it began or reset) a trim may take it;
/// the ring is grown by that depth, so the rows a query needs after a trim
/// are still held (SPEC §5's bound with the depth in place of the chunk).
struct TrimDraws {
  Prng rng;
  std::int64_t depth = 0;
};

/// The prefix profile's draws (their own stream): a request's first step
/// often begins it from a shared prefix of a request that has begun, live
/// or finished: all of its committed positions or fewer.
struct PrefixDraws {
  Prng rng;
};

/// Draws the requests (1..max_requests, each on a state id) and a schedule of
/// up to `steps` steps over them; with `work`, every step is fitted to what
/// is left of the budget and the schedule ends when nothing fits; with
/// `trims`, a step of a begun request is sometimes a trim instead (drawn
/// from their own stream, so the other draws stay as they were).
void draw_schedule(Prng& rng, Scenario& sc, const int (&weights)[kKinds], std::int64_t max_chunk,
                   std::int64_t max_drafts, std::int64_t max_requests, std::int64_t min_steps,
                   std::int64_t max_steps, WorkLeft* work, std::int64_t max_positions,
                   TrimDraws* trims = nullptr, PrefixDraws* prefixes = nullptr) {
  const auto& c = sc.cache;
  const std::int64_t request_count = rng.range(1, max_requests);
  for (std::int64_t r = 0; r < request_count; ++r) {
    sc.requests.push_back({r, static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(c.states)))});
  }

  // Who has begun, finished and holds which state: scenarios::RequestLifecycle.
  scenarios::RequestLifecycle lifecycle;
  const auto state_of = [&](std::int64_t r) { return sc.requests[static_cast<std::size_t>(r)].state; };
  const std::int64_t budget = rng.range(min_steps, max_steps);
  // Decisions the schedule used to leave out, from their own stream so that a
  // case where none fires keeps its draws: another request steps while a
  // verify is pending, and a finish or reset ends a pending verify's drafts.
  Prng extra(mix_seed(sc.data.seed, 0x70656e64));  // "pend"
  const bool end_pending = weights[kFinish] + weights[kReset] > 0;
  std::map<std::int64_t, std::int64_t> high;  // request -> one past the highest row written since begin/reset
  for (std::int64_t s = 0; s < budget; ++s) {
    // Requests that may take a step now.
    std::vector<std::int64_t> ready;
    for (std::int64_t r = 0; r < request_count; ++r) {
      if (lifecycle.phase(r) == scenarios::RequestLifecycle::Phase::kFinished) continue;
      if (lifecycle.may_hold(r, state_of(r))) ready.push_back(r);
    }
    if (ready.empty()) break;
    std::int64_t r = ready[static_cast<std::size_t>(rng.below(ready.size()))];
    if (lifecycle.progress(r).pending() && ready.size() > 1 && extra.chance(3, 4)) {
      // Another request steps first; its verify stays pending.
      std::vector<std::int64_t> others;
      for (const std::int64_t o : ready) {
        if (o != r) others.push_back(o);
      }
      r = others[static_cast<std::size_t>(extra.below(others.size()))];
    }
    const scenarios::RequestProgress& progress = lifecycle.progress(r);
    const bool started = lifecycle.phase(r) != scenarios::RequestLifecycle::Phase::kIdle;
    Step step;
    step.request = r;
    if (progress.pending()) {
      step.kind = StepKind::kAccept;
      step.accepted = rng.range(0, progress.pending_drafts);  // drawn even when replaced: later draws stay
      if (end_pending && extra.chance(1, 4)) {
        // The request finishes or resets with its drafts pending (legal: they are dropped).
        const bool finish = weights[kFinish] > 0 && (weights[kReset] == 0 || extra.chance(1, 2));
        step.kind = finish ? StepKind::kFinish : StepKind::kReset;
        step.accepted = 0;
      }
    } else {
      const auto& slot = scenarios::step_capability_info(static_cast<StepCapability>(pick(rng, weights)));
      step.kind = slot.kind;
      switch (scenarios::step_kind_fields(slot.kind)) {
        case scenarios::StepFields::kRowsOrder:
          step.order = slot.order;
          // Long chunks are drawn often so windows fill and rings wrap.
          step.rows = rng.chance(1, 2) ? max_chunk : rng.range(1, max_chunk);
          break;
        case scenarios::StepFields::kDrafts: step.drafts = rng.range(0, max_drafts); break;
        case scenarios::StepFields::kAccepted:
        case scenarios::StepFields::kPositions:
        case scenarios::StepFields::kNone: break;
      }
      // A finish or reset of a request that has not begun would do nothing: a decode instead.
      if (scenarios::step_kind_needs_begun(step.kind) && !started) step = Step{StepKind::kDecode, r};
    }
    if (trims != nullptr && started) {
      // At most `depth` below the highest row written (a pending verify's included).
      const std::int64_t top = std::max(high[r], progress.speculative_length());
      const std::int64_t most = std::min(progress.length, trims->depth - (top - progress.length));
      if (most >= 1 && trims->rng.chance(1, 4)) {
        step = Step{StepKind::kTrim, r};
        step.positions = trims->rng.range(1, most);
      }
    }
    if (max_positions > 0 && scenarios::step_rows(step) > 0) {
      // The cache's longest request: a step is shortened to end there; a
      // request with no room left takes no more writing steps.
      const std::int64_t room = max_positions - scenarios::step_first_position(progress);
      if (room <= 0) {
        continue;
      } else if (step.kind == StepKind::kPrefill) {
        step.rows = std::min(step.rows, room);
      } else if (step.kind == StepKind::kVerify) {
        step.drafts = std::min(step.drafts, room - 1);
      }
    }
    if (work) {
      const std::int64_t first = scenarios::step_first_position(progress);
      const std::int64_t rows = scenarios::step_rows(step);
      const std::int64_t fits = rows > 0 ? work->fit(first, rows) : 0;
      if (rows > 0 && fits == 0) break;  // the budget is spent
      if (step.kind == StepKind::kPrefill) step.rows = fits;
      if (step.kind == StepKind::kVerify) step.drafts = fits - 1;
      work->charge(first, scenarios::step_rows(step));
    }
    std::int64_t prefix_positions = 0;
    if (prefixes != nullptr && !started) {
      // Requests with committed rows to start from (live or finished).
      std::vector<std::int64_t> sources;
      for (std::int64_t o = 0; o < request_count; ++o) {
        if (o != r && lifecycle.phase(o) != scenarios::RequestLifecycle::Phase::kIdle &&
            lifecycle.progress(o).length >= 1)
          sources.push_back(o);
      }
      if (!sources.empty() && prefixes->rng.chance(3, 4)) {
        const std::int64_t o = sources[static_cast<std::size_t>(prefixes->rng.below(sources.size()))];
        const std::int64_t length = lifecycle.progress(o).length;
        prefix_positions = prefixes->rng.chance(1, 3) ? length : prefixes->rng.range(1, length);
        const std::int64_t room = max_positions > 0 ? max_positions - prefix_positions : 1;
        if (room <= 0 && scenarios::step_rows(step) > 0) {
          prefix_positions = 0;
        } else {
          sc.requests[static_cast<std::size_t>(r)].prefix = scenarios::Prefix{o, prefix_positions};
        }
      }
    }
    // Begins the request (at its prefix's length), advances it, frees its state at finish.
    lifecycle.step(r, state_of(r), step, prefix_positions);
    if (trims != nullptr) {
      const std::int64_t reached = lifecycle.progress(r).speculative_length();
      high[r] = step.kind == StepKind::kReset ? 0 : std::max(high[r], reached);
    }
    sc.steps.push_back(step);
  }
  // Close a pending verify so every schedule ends in a committed state.
  for (std::int64_t r = 0; r < request_count; ++r) {
    if (lifecycle.progress(r).pending()) {
      Step a;
      a.kind = StepKind::kAccept;
      a.request = r;
      a.accepted = rng.range(0, lifecycle.progress(r).pending_drafts);
      sc.steps.push_back(a);
    }
  }
  // Requests that never ran are dropped so the file stays minimal.
  std::vector<scenarios::Request> used;
  for (const auto& req : sc.requests) {
    if (lifecycle.phase(req.id) != scenarios::RequestLifecycle::Phase::kIdle) used.push_back(req);
  }
  sc.requests = used;
}

/// The layers profile, for a cache that declares per_layer_windows: 2..4
/// layers, each sliding (the case's window, or a narrower one) or global
/// (one in three), layer 1 unlike layer 0; drawn from their own stream
/// after the schedule, so the draws above are the default profile's. A
/// global layer sees every position, so the ring then holds the longest
/// request (a global layer never frees a row); narrower sliding windows
/// keep the drawn ring safe.
void draw_layer_windows(Scenario& sc, const engines::Capabilities& caps) {
  auto& c = sc.cache;
  Prng rng(mix_seed(sc.data.seed, 0x6c617972));  // "layr"
  std::int32_t most = 4;
  if (caps.max_layers > 0) most = static_cast<std::int32_t>(std::min<std::int64_t>(most, caps.max_layers));
  if (most < 2) return;
  c.layers = static_cast<std::int32_t>(rng.range(2, most));
  const std::int64_t keys = window_keys(c);
  // A sliding layer's window in the cache's convention, keys 1..keys.
  auto sliding = [&](std::int64_t k) {
    return scenarios::LayerWindow{c.convention == scenarios::Convention::kKeys ? k : k - 1, c.convention};
  };
  const std::int64_t lowest_keys = c.convention == scenarios::Convention::kKeys ? 1 : 2;
  c.layer_windows.clear();
  for (std::int32_t l = 0; l < c.layers; ++l) {
    scenarios::LayerWindow w;
    if (rng.chance(1, 3)) {
      w = scenarios::LayerWindow{std::nullopt, scenarios::Convention::kKeys};
    } else {
      w = sliding(rng.chance(1, 2) || keys <= lowest_keys ? keys : rng.range(lowest_keys, keys));
    }
    if (l == 1 && w == c.layer_windows[0]) {
      // Layer 1 differs from layer 0: a window taken from the wrong layer shows.
      w = c.layer_windows[0].window ? scenarios::LayerWindow{std::nullopt, scenarios::Convention::kKeys}
                                    : sliding(keys);
    }
    c.layer_windows.push_back(w);
  }
  if (scenarios::has_global_layer(c)) c.ring_rows = std::max(c.ring_rows, scenarios::schedule_end(sc.steps));
  // Explicit rows name layers: none are drawn by the generator.
}

/// Last touches shared by both profiles, then validation.
void finish_scenario(Scenario& sc, const engines::Capabilities& caps) {
  if (caps.full_window_only) {
    // A cache that attends to every row it holds: window and capacity cover
    // every position the schedule writes, so nothing ever slides or wraps.
    const std::int64_t end = scenarios::schedule_end(sc.steps, sc.requests);
    sc.cache.convention = scenarios::Convention::kKeys;
    sc.cache.window = sc.cache.ring_rows = end;
  }
  // Value profile (properties/value_profiles.hpp) from its own stream, so the draws above stay as they were.
  Prng profile_rng(mix_seed(sc.data.seed, 0x76616c75));  // "valu"
  sc.data.profile =
      draw_value_profile(sc.cache, !(caps.reports_written_slots && caps.reports_read_slots), profile_rng);
  scenarios::validate_scenario(sc);
}

/// A window convention: keys four times in six, left and off-by-one once each.
scenarios::Convention draw_convention(Prng& rng) {
  const std::uint64_t conv = rng.below(6);
  return conv < 4 ? scenarios::Convention::kKeys
                  : (conv == 4 ? scenarios::Convention::kLeft : scenarios::Convention::kOffByOne);
}

/// Rows of slack over the safe ring: none five times in eight, else 1..3.
std::int64_t small_slack(Prng& rng) {
  const std::uint64_t slack_draw = rng.below(8);
  return slack_draw < 5 ? 0 : static_cast<std::int64_t>(slack_draw) - 4;
}

/// The small shapes of the default and paged profiles: 1..2 KV heads in
/// groups of 1..2, head_dim 2..8, formats, RoPE, layers and sink.
void draw_small_shape(Prng& rng, scenarios::CacheConfig& c) {
  c.kv_heads = static_cast<std::int32_t>(rng.range(1, 2));
  c.q_heads = c.kv_heads * static_cast<std::int32_t>(rng.range(1, 2));
  c.shared_row = c.kv_heads == 1 && rng.chance(1, 4);
  c.head_dim = static_cast<std::int32_t>(2 << rng.below(3));  // 2, 4, 8
  // Five in eight f64, one each f32, bf16, fp8: an explicit list, so a
  // format added to the table changes no seed's case.
  static constexpr scenarios::Format kDefaultFormats[] = {
      scenarios::Format::kF64, scenarios::Format::kF64, scenarios::Format::kF64,  scenarios::Format::kF64,
      scenarios::Format::kF64, scenarios::Format::kF32, scenarios::Format::kBf16, scenarios::Format::kFp8};
  c.format = kDefaultFormats[rng.below(8)];
  if (rng.chance(2, 3)) {
    c.rope.style = rng.chance(1, 2) ? scenarios::RopeStyle::kNeox : scenarios::RopeStyle::kInterleaved;
    c.rope.rotary_dims = static_cast<std::int32_t>(2 * rng.range(1, c.head_dim / 2));
    c.rope.base = rng.chance(1, 2) ? 10000.0 : 100.0;
  }
  c.layers = rng.chance(1, 6) ? 2 : 1;
  if (rng.chance(1, 6)) c.sink_logit = static_cast<double>(rng.range(-2, 2));
}

/// A named scenario with its data seed and swarm weights drawn.
Scenario begin_scenario(Prng& rng, const std::string& name, const std::string& description,
                        const engines::Capabilities& caps, int (&weights)[kKinds]) {
  Scenario sc;
  sc.name = name;
  sc.description = description;
  sc.data.seed = rng.next() >> 1;
  draw_weights(rng, caps, weights);
  return sc;
}

/// begin_scenario named for `profile`'s case from `seed`: "trim-7", "kvcheck
/// check --profile trim case drawn from seed 7" (the default profile's:
/// "generated-7", "kvcheck check case drawn from seed 7").
Scenario begin_profile_scenario(Prng& rng, Profile profile, std::uint64_t seed, const engines::Capabilities& caps,
                                int (&weights)[kKinds]) {
  const std::string n = std::to_string(seed);
  if (profile == Profile::kDefault)
    return begin_scenario(rng, "generated-" + n, "kvcheck check case drawn from seed " + n, caps, weights);
  const std::string name = profile_name(profile);
  return begin_scenario(rng, name + "-" + n, "kvcheck check --profile " + name + " case drawn from seed " + n, caps,
                        weights);
}

/// The default profile's cases, with trims (Profile::kTrim), layer windows
/// (kLayers) or shared prefixes (kPrefix) drawn where the cache has them.
Scenario generate_default(std::uint64_t seed, const engines::Capabilities& caps, Profile profile) {
  Prng rng(seed);
  int weights[kKinds];
  Scenario sc = begin_profile_scenario(rng, profile, seed, caps, weights);

  auto& c = sc.cache;
  c.window = rng.range(1, 7);
  c.convention = draw_convention(rng);
  fit_window(c, caps);
  const std::int64_t keys = window_keys(c);
  std::int64_t max_drafts = weights[kVerify] ? rng.range(1, 4) : 0;
  const bool prefill_on = weights[kPrefillLts] + weights[kPrefillStl] > 0;
  std::int64_t max_chunk = prefill_on ? rng.range(1, 2 * keys + 2) : 1;
  fit_step_bounds(caps, &max_chunk, &max_drafts);
  // Minimum safe ring for these bounds (SPEC §5), then 0..2 rows of slack.
  const std::int64_t safe = safe_ring_rows(keys, max_chunk, max_drafts, weights[kPrefillStl] > 0);
  c.ring_rows = safe + small_slack(rng);
  c.states = rng.range(1, 3);
  draw_small_shape(rng, c);
  fit_to_caps(c, caps);
  // The trim profile, for a cache that trims: the depth a trim may reach
  // (past a pending verify's rows, often), and the ring grown by it.
  std::optional<TrimDraws> trims;
  if (profile == Profile::kTrim && caps.trim) {
    trims.emplace(TrimDraws{Prng(mix_seed(sc.data.seed, 0x7472696d)), 0});  // "trim"
    trims->depth = max_drafts + 1 + trims->rng.range(1, keys + 2);
    c.ring_rows += trims->depth;
  }
  // Requests: 1..3, each with a state id; later requests may reuse a state.
  // The prefix profile, for a cache that shares prefixes: up to 4 requests
  // on at least two states (where the cache has them), prefixes drawn from
  // their own stream.
  std::optional<PrefixDraws> prefixes;
  if (profile == Profile::kPrefix && caps.prefix_sharing) {
    prefixes.emplace(PrefixDraws{Prng(mix_seed(sc.data.seed, 0x70726678))});  // "prfx"
    if (caps.max_states == 0 || caps.max_states >= 2) c.states = std::max<std::int64_t>(c.states, 2);
  }
  draw_schedule(rng, sc, weights, max_chunk, max_drafts, prefixes ? 4 : 3, prefixes ? 6 : 4, prefixes ? 20 : 16,
                nullptr, caps.max_positions, trims ? &*trims : nullptr, prefixes ? &*prefixes : nullptr);
  if (profile == Profile::kLayers && caps.per_layer_windows && !caps.full_window_only) draw_layer_windows(sc, caps);
  finish_scenario(sc, caps);
  return sc;
}

/// Bytes of one slot of the CPU pool for this configuration.
std::int64_t slot_bytes(const scenarios::CacheConfig& c) {
  const std::int64_t row = format_row_bytes(c.format, std::int64_t{c.kv_heads} * c.head_dim);
  return c.shared_row ? row : 2 * row;
}

/// Rows a long-context case writes at least: RoPE angles past 10^5.
constexpr std::int64_t kLongContextRows = 100'000;

/// Turns a production case into a long-context one: one request runs past
/// position 10^5 (where angle errors grow: README "Tolerances") in prefill
/// chunks of up to 2048 rows, then a few decodes. One head of 64 and a
/// window of 1..3 keys keep the reference's work at a few keys per row, and
/// the runner keeps only the rows a window can still see, so the case costs
/// about a second and bounded memory (README "Production profile").
void make_long_context(Scenario& sc, Prng& rng, const engines::Capabilities& caps) {
  auto& c = sc.cache;
  c.window = rng.range(1, 3);
  fit_window(c, caps);
  c.q_heads = c.kv_heads = 1;
  c.head_dim = 64;
  c.shared_row = false;
  c.layers = 1;
  c.states = 1;
  c.rope.style = rng.chance(1, 2) ? scenarios::RopeStyle::kNeox : scenarios::RopeStyle::kInterleaved;
  c.rope.rotary_dims = 64;
  c.rope.base = rng.chance(1, 2) ? 10000.0 : 500000.0;
  fit_to_caps(c, caps);
  std::int64_t chunk = 2048, drafts = 0;
  fit_step_bounds(caps, &chunk, &drafts);
  c.ring_rows = safe_ring_rows(window_keys(c), chunk, 0, true) + rng.range(0, 3);
  sc.requests = {{0, 0}};
  sc.steps.clear();
  const std::int64_t end = kLongContextRows + rng.range(1, 4096);
  for (std::int64_t written = 0; written < end;) {
    Step step;
    step.kind = StepKind::kPrefill;
    const bool lts = caps.prefill_load_then_store && (!caps.prefill_store_then_load || rng.chance(1, 2));
    step.order = lts ? Order::kLoadThenStore : Order::kStoreThenLoad;
    step.rows = std::min(chunk, end - written);
    written += step.rows;
    sc.steps.push_back(step);
  }
  for (std::int64_t d = rng.range(1, 4); d > 0; --d) sc.steps.push_back(Step{});  // decodes
}

Scenario generate_production(std::uint64_t seed, const engines::Capabilities& caps) {
  Prng rng(mix_seed(seed, 0x70726f64));  // "prod": its own stream, apart from the default profile's
  int weights[kKinds];
  Scenario sc = begin_profile_scenario(rng, Profile::kProduction, seed, caps, weights);
  const ProductionBudget budget = production_budget();

  auto& c = sc.cache;
  // One case in eight is long and narrow (tiny window, one 64-wide head,
  // prefill chunks of 1024..2048 rows), the only shape whose long chunks
  // the reference can afford; the rest have windows a quarter short
  // (1..64), a quarter medium (65..1024) and half long (1025..8192).
  const bool narrow = rng.chance(1, 8);
  const std::uint64_t w = rng.below(4);
  c.window = narrow ? rng.range(1, 3)
                    : (w == 0 ? rng.range(1, 64) : (w == 1 ? rng.range(65, 1024) : rng.range(1025, 8192)));
  c.convention = static_cast<scenarios::Convention>(rng.below(3));
  fit_window(c, caps);
  const std::int64_t keys = window_keys(c);
  std::int64_t max_drafts = weights[kVerify] ? rng.range(1, 16) : 0;
  const bool prefill_on = weights[kPrefillLts] + weights[kPrefillStl] > 0;
  std::int64_t max_chunk = prefill_on ? (rng.chance(1, 2) ? rng.range(1, 2048) : rng.range(1, 64)) : 1;
  if (narrow && prefill_on) max_chunk = rng.range(1024, 2048);
  fit_step_bounds(caps, &max_chunk, &max_drafts);
  const std::int64_t safe = safe_ring_rows(keys, max_chunk, max_drafts, weights[kPrefillStl] > 0);
  const std::uint64_t slack_draw = rng.below(8);
  c.ring_rows =
      safe +
      (slack_draw < 5 ? 0 : (slack_draw < 7 ? static_cast<std::int64_t>(slack_draw) - 4 : rng.range(3, 64)));
  c.states = rng.range(1, 4);
  static constexpr std::int32_t kGroups[] = {1, 2, 4, 4, 8, 8};  // the AVX-512 kernel wants groups of 4 or 8
  c.kv_heads = std::int32_t{1} << rng.below(4);                  // 1, 2, 4, 8
  c.q_heads = c.kv_heads * kGroups[rng.below(6)];                // up to 64
  c.shared_row = c.kv_heads == 1 && rng.chance(1, 6);
  c.head_dim = static_cast<std::int32_t>(64 << rng.below(3));  // 64, 128, 256
  if (narrow) c.q_heads = c.kv_heads = 1, c.head_dim = 64;
  static constexpr scenarios::Format kFormats[] = {scenarios::Format::kBf16, scenarios::Format::kBf16,
                                                   scenarios::Format::kFp8, scenarios::Format::kFp8,
                                                   scenarios::Format::kF32};
  c.format = kFormats[rng.below(5)];
  if (rng.chance(5, 6)) {
    c.rope.style = rng.chance(1, 2) ? scenarios::RopeStyle::kNeox : scenarios::RopeStyle::kInterleaved;
    c.rope.rotary_dims = rng.chance(1, 4) ? c.head_dim / 2 : c.head_dim;
    c.rope.base = rng.chance(1, 2) ? 10000.0 : 500000.0;
  }
  c.layers = rng.chance(1, 8) ? 2 : 1;
  if (rng.chance(1, 8)) c.sink_logit = static_cast<double>(rng.range(-2, 2));
  fit_to_caps(c, caps);
  // The pool within its budget: fewer states first, then fewer KV heads
  // (same group), then one layer (one state, one KV head and one layer of
  // the widest draw is 8193 + 2048 + 16 + 64 rows of 2 KiB: 21 MiB).
  const auto pool_bytes = [&c] { return std::int64_t{c.layers} * c.states * c.ring_rows * slot_bytes(c); };
  while (pool_bytes() > budget.pool_bytes) {
    if (c.states > 1) {
      c.states -= 1;
    } else if (c.kv_heads > 1) {
      c.q_heads /= 2;
      c.kv_heads /= 2;
    } else if (c.layers > 1) {
      c.layers = 1;
    } else {
      break;
    }
  }
  WorkLeft work(c, budget);
  draw_schedule(rng, sc, weights, max_chunk, max_drafts, 4, 4, 24, &work, caps.max_positions);
  // Drawn last, so the other cases keep their draws.
  const bool prefill = caps.prefill_load_then_store || caps.prefill_store_then_load;
  const bool long_fits = caps.max_positions == 0 || caps.max_positions > kLongContextRows + 4096 + 4;
  if (prefill && !caps.full_window_only && rng.chance(1, 16) && long_fits) make_long_context(sc, rng, caps);
  finish_scenario(sc, caps);
  return sc;
}

/// The paged profile (Profile::kPaged), from its own stream ("page"), so
/// the other profiles' cases stay as they were.
Scenario generate_paged(std::uint64_t seed, const engines::Capabilities& caps) {
  Prng rng(mix_seed(seed, 0x70616765));  // "page"
  int weights[kKinds];
  Scenario sc = begin_profile_scenario(rng, Profile::kPaged, seed, caps, weights);
  // State churn and verifies that straddle blocks: finish and verify are on
  // wherever the cache runs them.
  if (caps.finish) weights[kFinish] = 1;
  if (caps.verify) weights[kVerify] = std::max(weights[kVerify], 2);
  const std::int64_t block = caps.block_size > 0 ? caps.block_size : 4;
  auto& c = sc.cache;
  // Windows of up to three blocks (48 keys at most), one in four inside one block.
  const std::int64_t widest = std::min<std::int64_t>(3 * block, 48);
  const std::int64_t narrow = std::min(block, widest);
  c.window = rng.chance(1, 4) ? rng.range(1, narrow) : rng.range(narrow, widest);
  c.convention = draw_convention(rng);
  fit_window(c, caps);
  const std::int64_t keys = window_keys(c);
  std::int64_t max_drafts = weights[kVerify] ? rng.range(1, 6) : 0;
  const bool prefill_on = weights[kPrefillLts] + weights[kPrefillStl] > 0;
  // Chunks up to a window and a block: prefills cross blocks and free them.
  std::int64_t max_chunk = prefill_on ? rng.range(1, keys + block) : 1;
  fit_step_bounds(caps, &max_chunk, &max_drafts);
  c.ring_rows = safe_ring_rows(keys, max_chunk, max_drafts, weights[kPrefillStl] > 0) + small_slack(rng);
  c.states = rng.range(2, 4);
  draw_small_shape(rng, c);
  fit_to_caps(c, caps);
  // Up to 8 requests over 16..40 steps on 2..4 states: requests wait for a
  // state, finish or reset at any length (long and short ones), and the
  // next takes the freed blocks.
  draw_schedule(rng, sc, weights, max_chunk, max_drafts, 8, 16, 40, nullptr, caps.max_positions);
  finish_scenario(sc, caps);
  return sc;
}

}  // namespace

Scenario generate_scenario(std::uint64_t seed, const engines::Capabilities& caps, Profile profile) {
  if (profile == Profile::kPaged) return generate_paged(seed, caps);
  return profile == Profile::kProduction ? generate_production(seed, caps)
                                         : generate_default(seed, caps, profile);
}

namespace {

/// The prefix profile's classes. A block is the cache's (block_size; 1 when
/// it declares none); a prefix of n shares blocks 0 .. (n-1)/B while both
/// requests keep those rows (neither has reset since).
void classify_prefixes(const Scenario& sc, const engines::Capabilities& caps, Coverage* cov) {
  const std::int64_t B = caps.block_size > 0 ? caps.block_size : 1;
  const std::int64_t keys = window_keys(sc.cache);
  struct Share {
    std::int64_t sharer, source, n;
    bool live = true;          // neither has reset or had its rows taken back since the begin
    bool sharer_wrote = false;  // the sharer has written since the begin
  };
  std::vector<Share> shares;
  std::map<std::int64_t, const scenarios::Request*> by_id;
  for (const auto& r : sc.requests) by_id[r.id] = &r;
  scenarios::RequestLifecycle life;
  for (const auto& s : sc.steps) {
    const bool first_seen = life.phase(s.request) == scenarios::RequestLifecycle::Phase::kIdle;
    const scenarios::Request* req = by_id.count(s.request) ? by_id[s.request] : nullptr;
    std::int64_t n0 = 0;
    if (first_seen && req && req->prefix) {
      const auto phase = life.phase(req->prefix->request);
      if (phase == scenarios::RequestLifecycle::Phase::kActive) cov->prefix_of_live = true;
      if (phase == scenarios::RequestLifecycle::Phase::kFinished) cov->prefix_of_finished = true;
      n0 = req->prefix->positions;
      shares.push_back(Share{s.request, req->prefix->request, n0});
    }
    const std::int64_t first = scenarios::step_first_position(life.progress(s.request));
    const std::int64_t rows = scenarios::step_rows(s);
    life.step(s.request, req ? req->state : 0, s, n0);
    for (Share& sh : shares) {
      if (!sh.live) continue;
      const bool mine = s.request == sh.sharer || s.request == sh.source;
      if (!mine) continue;
      const std::int64_t last_block = (sh.n - 1) / B;
      // A write into the block the prefix ends in, by either side.
      if (rows > 0 && sh.n % B != 0 && first / B == last_block && !(s.request == sh.sharer && sh.sharer_wrote))
        cov->cow_write_into_shared_block = true;
      if (rows > 0 && s.request == sh.sharer) sh.sharer_wrote = true;
      if (s.kind == StepKind::kReset || s.kind == StepKind::kTrim) sh.live = false;
      // One side's window has left a shared block the other still sees.
      const auto sees_from = [&](std::int64_t id) {
        return life.phase(id) == scenarios::RequestLifecycle::Phase::kActive
                   ? std::optional<std::int64_t>(life.progress(id).length - keys + 1)
                   : std::nullopt;
      };
      const auto a = sees_from(sh.sharer), b = sees_from(sh.source);
      if (a && b) {
        for (std::int64_t j = 0; j <= last_block; ++j) {
          const std::int64_t block_last = std::min((j + 1) * B, sh.n) - 1;
          if ((block_last < *a) != (block_last < *b)) cov->window_free_of_shared_block = true;
        }
      }
    }
  }
}

}  // namespace

Coverage classify(const Scenario& sc, const engines::Capabilities& caps) {
  Coverage cov;
  const std::int64_t keys = window_keys(sc.cache);
  std::map<std::int64_t, scenarios::RequestProgress> progress = scenarios::start_progress(sc.requests);
  std::map<std::int64_t, std::int64_t> state_of;
  for (const auto& r : sc.requests) state_of[r.id] = r.state;
  std::map<std::int64_t, bool> state_used, started, trimmed;
  bool wrote = false;
  for (const auto& s : sc.steps) {
    for (const auto& [other, q] : progress) {
      if (other != s.request && q.pending()) cov.verify_then_other_request = true;
    }
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
    if ((s.kind == StepKind::kFinish || s.kind == StepKind::kReset) && p.pending()) {
      cov.finish_or_reset_with_drafts_pending = true;
    }
    if (s.kind == StepKind::kTrim) {
      trimmed[s.request] = true;
      if (p.pending()) cov.trim_with_drafts_pending = true;
    }
    if (n > 0 && trimmed[s.request]) cov.write_after_trim = true;
    if (n > 0 && keys >= 4096) cov.window_4096 = true;
    if (s.kind == StepKind::kPrefill && s.rows >= 1024) cov.chunk_1024 = true;
    if (s.kind == StepKind::kVerify && s.drafts >= 8) cov.verify_8_drafts = true;
    if (n > 0 && scenarios::step_first_position(p) + n - 1 >= kLongContextRows) cov.position_100k = true;
    if (n > 0) wrote = true;
    scenarios::advance(p, s);
  }
  // Layer windows: a global layer beside a sliding one whose window slides
  // (some position at or past its keys), and two sliding windows that differ.
  const std::int64_t end = scenarios::schedule_end(sc.steps);
  std::int64_t narrowest = 0, widest = 0;
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(sc.cache.layer_windows.size()); ++l) {
    if (!sc.cache.layer_windows[static_cast<std::size_t>(l)].window) continue;
    const std::int64_t k = scenarios::layer_window_keys(sc.cache, l);
    narrowest = narrowest == 0 ? k : std::min(narrowest, k);
    widest = std::max(widest, k);
  }
  cov.sliding_and_global_layers = scenarios::has_global_layer(sc.cache) && narrowest > 0 && end > narrowest;
  cov.sliding_windows_differ = narrowest > 0 && widest > narrowest && end > narrowest;
  classify_prefixes(sc, caps, &cov);
  // The cache's own dispatch decides (Capabilities::fast_kernel_runs); its
  // queries run the kernel once any step writes rows.
  cov.fast_cpu_kernel = wrote && caps.fast_kernel_runs && caps.fast_kernel_runs(cache_spec(sc));
  // The cache's own kernel paths (Capabilities::kernel_paths_run), for the
  // queries of each step that writes rows (each attends that many).
  if (caps.kernel_paths_run) {
    std::vector<std::int64_t> queries;
    for (const auto& s : sc.steps) {
      if (const std::int64_t n = scenarios::step_rows(s); n > 0) queries.push_back(n);
    }
    cov.kernel_paths = caps.kernel_paths_run(cache_spec(sc), queries);
  }
  cov.kernel_paths.resize(caps.kernel_paths.size(), false);
  return cov;
}

BlockCounts classify_blocks(const Scenario& sc, const RunObservation& run, std::int64_t block_size, Coverage* cov) {
  BlockCounts counts;
  if (block_size <= 0) return counts;
  const std::int64_t keys = window_keys(sc.cache);
  // Frees from the schedule: per request, the blocks [low, high) it holds,
  // by position (low: the first the window has not freed). A request from a
  // shared prefix starts at its length.
  std::map<std::int64_t, scenarios::RequestProgress> progress = scenarios::start_progress(sc.requests);
  std::map<std::int64_t, std::int64_t> low, high;
  for (const Step& s : sc.steps) {
    scenarios::RequestProgress& p = progress[s.request];
    std::int64_t& lo = low[s.request];
    std::int64_t& hi = high[s.request];
    const std::int64_t n = scenarios::step_rows(s);
    if (n > 0) hi = std::max(hi, (scenarios::step_first_position(p) + n - 1) / block_size + 1);
    scenarios::advance(p, s);
    if (s.kind == StepKind::kFinish || s.kind == StepKind::kReset) {
      counts.end_frees += hi - lo;
      lo = hi = 0;
      continue;
    }
    // Rows below the first position the request's next query sees.
    const std::int64_t next = p.next_query_first();
    const std::int64_t gone = std::min(std::max<std::int64_t>(next - keys + 1, 0) / block_size, hi);
    if (gone > lo) {
      counts.window_frees += gone - lo;
      cov->block_free = true;
      lo = gone;
    }
  }
  // Reuses and straddling verifies from the slots the cache reported (layer 0).
  std::map<std::int64_t, std::int64_t> epoch;  // request -> resets so far
  struct Holder {
    std::int64_t request, epoch, block;
    bool operator==(const Holder&) const = default;
  };
  std::map<std::int64_t, Holder> holder;  // block id -> the rows it last took
  for (const StepObservation& o : run.steps) {
    if (o.layer != 0 || o.step < 0 || o.step >= static_cast<std::int64_t>(sc.steps.size())) continue;
    const StepKind kind = sc.steps[static_cast<std::size_t>(o.step)].kind;
    if (kind == StepKind::kReset) ++epoch[o.request];
    if (kind == StepKind::kVerify) {
      std::int64_t lowest = -1, highest = -1;
      if (!o.written_slots.empty()) {
        const auto [a, b] = std::minmax_element(o.written_slots.begin(), o.written_slots.end());
        lowest = *a / block_size, highest = *b / block_size;
      } else if (!o.queries.empty()) {
        lowest = o.first_position / block_size;
        highest = (o.first_position + static_cast<std::int64_t>(o.queries.size()) - 1) / block_size;
      }
      if (highest > lowest) cov->verify_straddles_block = true;
    }
    for (std::size_t i = 0; i < o.written_slots.size(); ++i) {
      if (o.written_slots[i] < 0) continue;
      const Holder h{o.request, epoch[o.request],
                     (o.first_position + static_cast<std::int64_t>(i)) / block_size};
      const auto [it, fresh] = holder.try_emplace(o.written_slots[i] / block_size, h);
      if (fresh || it->second == h) continue;
      ++counts.reuses;
      if (it->second.request != h.request) cov->block_reuse_after_free = true;
      it->second = h;
    }
  }
  return counts;
}

}  // namespace kvcheck::properties
