#include "properties/generator.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <optional>

#include "properties/runner.hpp"
#include "properties/value_profiles.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/assert.hpp"
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
// Trim is drawn apart from the step weights, by its feature part (TrimPart,
// its own stream): its slot's weight stays 0 in the swarm's draws.
constexpr int kTrim = static_cast<int>(StepCapability::kTrim);
// Preempt likewise, by PreemptPart (docs/semantics.md "Preemption").
constexpr int kPreempt = static_cast<int>(StepCapability::kPreempt);

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

namespace {

/// The schedule classes, in Coverage field order, with their members.
struct ScheduleClass {
  const char* name;
  bool Coverage::*member;
  /// Gated from this many cases on: the classes every small check reaches
  /// from 1, those of a feature drawn in about half the cases as the
  /// feature's own class (kFeatureGateCases).
  std::int64_t gate_cases = 1;
};
constexpr ScheduleClass kScheduleClasses[] = {
    {"ring_wrap", &Coverage::ring_wrap},
    {"verify_rejection", &Coverage::verify_rejection},
    {"chunk_longer_than_window", &Coverage::chunk_longer_than_window},
    {"state_reuse", &Coverage::state_reuse},
    {"fast_cpu_kernel", &Coverage::fast_cpu_kernel},
    {"window_4096", &Coverage::window_4096},
    {"chunk_1024", &Coverage::chunk_1024},
    {"verify_8_drafts", &Coverage::verify_8_drafts},
    {"position_100k", &Coverage::position_100k},
    {"verify_then_other_request", &Coverage::verify_then_other_request},
    {"finish_or_reset_with_drafts_pending", &Coverage::finish_or_reset_with_drafts_pending},
    {"write_after_trim", &Coverage::write_after_trim, kFeatureGateCases},
    {"trim_with_drafts_pending", &Coverage::trim_with_drafts_pending, kFeatureGateCases},
    {"block_free", &Coverage::block_free, kFeatureGateCases},
    {"block_reuse_after_free", &Coverage::block_reuse_after_free, kFeatureGateCases},
    {"verify_straddles_block", &Coverage::verify_straddles_block, kFeatureGateCases},
    {"sliding_and_global_layers", &Coverage::sliding_and_global_layers, kFeatureGateCases},
    {"sliding_windows_differ", &Coverage::sliding_windows_differ, kFeatureGateCases},
    {"prefix_of_live", &Coverage::prefix_of_live, kFeatureGateCases},
    {"prefix_of_finished", &Coverage::prefix_of_finished, kFeatureGateCases},
    {"cow_write_into_shared_block", &Coverage::cow_write_into_shared_block, kFeatureGateCases},
    {"window_free_of_shared_block", &Coverage::window_free_of_shared_block, kFeatureGateCases},
    {"trim_into_prefix", &Coverage::trim_into_prefix, kFeatureGateCases},
    {"cached_block_evicted", &Coverage::cached_block_evicted, kFeatureGateCases},
    {"begin_from_evicted_prefix", &Coverage::begin_from_evicted_prefix, kFeatureGateCases},
    {"preempt_then_resume", &Coverage::preempt_then_resume, kFeatureGateCases},
    {"resume_with_prefix_hit", &Coverage::resume_with_prefix_hit, kFeatureGateCases},
    {"prefix_recomputed_in_step", &Coverage::prefix_recomputed_in_step, kFeatureGateCases},
    {"slot_across_layers", &Coverage::slot_across_layers, kFeatureGateCases},
};
constexpr std::size_t kScheduleClassCount = std::size(kScheduleClasses);

Feature feature_at(int i) { return static_cast<Feature>(i); }

}  // namespace

const std::vector<std::string>& coverage_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const ScheduleClass& c : kScheduleClasses) n.emplace_back(c.name);
    for (int f = 0; f < kFeatureCount; ++f) n.push_back(std::string("feature:") + feature_name(feature_at(f)));
    for (int a = 0; a < kFeatureCount; ++a) {
      for (int b = a + 1; b < kFeatureCount; ++b) {
        n.push_back(std::string("pair:") + feature_name(feature_at(a)) + "+" + feature_name(feature_at(b)));
      }
    }
    return n;
  }();
  return names;
}

const std::vector<CoverageKind>& coverage_kinds() {
  static const std::vector<CoverageKind> kinds = [] {
    std::vector<CoverageKind> k(kScheduleClassCount, CoverageKind::kSchedule);
    k.insert(k.end(), kFeatureCount, CoverageKind::kFeature);
    k.insert(k.end(), static_cast<std::size_t>(kFeatureCount * (kFeatureCount - 1) / 2), CoverageKind::kPair);
    return k;
  }();
  return kinds;
}

const std::vector<std::int64_t>& coverage_gate_cases() {
  static const std::vector<std::int64_t> gates = [] {
    std::vector<std::int64_t> g;
    for (const ScheduleClass& c : kScheduleClasses) g.push_back(c.gate_cases);
    g.insert(g.end(), kFeatureCount, kFeatureGateCases);
    g.insert(g.end(), static_cast<std::size_t>(kFeatureCount * (kFeatureCount - 1) / 2), kPairGateCases);
    return g;
  }();
  return gates;
}

std::size_t feature_class(Feature f) { return kScheduleClassCount + static_cast<std::size_t>(f); }

std::size_t pair_class(Feature a, Feature b) {
  auto i = static_cast<std::size_t>(a), j = static_cast<std::size_t>(b);
  KVCHECK_ASSERT(i != j);
  if (i > j) std::swap(i, j);
  const std::size_t n = kFeatureCount;
  // Pairs (i, j), i < j, row by row: row i starts after the rows above it.
  const std::size_t row_start = i * n - i * (i + 1) / 2;
  return kScheduleClassCount + n + row_start + (j - i - 1);
}

std::vector<bool> coverage_flags(const Coverage& c) {
  std::vector<bool> flags;
  flags.reserve(coverage_names().size());
  for (const ScheduleClass& s : kScheduleClasses) flags.push_back(c.*s.member);
  for (int f = 0; f < kFeatureCount; ++f) flags.push_back(c.features[static_cast<std::size_t>(f)]);
  for (int a = 0; a < kFeatureCount; ++a) {
    for (int b = a + 1; b < kFeatureCount; ++b) {
      flags.push_back(c.features[static_cast<std::size_t>(a)] && c.features[static_cast<std::size_t>(b)]);
    }
  }
  // The cache's own kernel paths, last.
  flags.insert(flags.end(), c.kernel_paths.begin(), c.kernel_paths.end());
  return flags;
}

std::vector<std::string> coverage_names(const engines::Capabilities& caps) {
  std::vector<std::string> names = coverage_names();
  names.insert(names.end(), caps.kernel_paths.begin(), caps.kernel_paths.end());
  return names;
}

std::vector<bool> reachable_coverage(const engines::Capabilities& caps, Profile profile) {
  const bool prefill = caps.prefill_load_then_store || caps.prefill_store_then_load;
  const bool production = profile == Profile::kProduction;
  const bool two_states = caps.max_states == 0 || caps.max_states >= 2;
  const FeatureSet drawable = drawable_features(caps, profile);
  const auto can = [&drawable](Feature f) { return drawable[static_cast<std::size_t>(f)]; };
  std::vector<bool> reach = {!caps.full_window_only, caps.verify, prefill && !caps.full_window_only,
                             caps.finish};
  // The production profile's shapes: a fast kernel of the cache's own, as it
  // declares it (the CPU ring pool's AVX-512 kernel, on a CPU that has
  // AVX-512), and the sizes only it draws.
  reach.push_back(production && static_cast<bool>(caps.fast_kernel_runs));
  reach.push_back(production && !caps.full_window_only &&
                  (caps.max_window_keys == 0 || caps.max_window_keys >= 4096));
  reach.push_back(production && prefill && (caps.max_step_rows == 0 || caps.max_step_rows >= 1024) &&
                  (caps.max_positions == 0 || caps.max_positions >= 1024));
  reach.push_back(production && caps.verify && (caps.max_step_rows == 0 || caps.max_step_rows >= 9) &&
                  (caps.max_positions == 0 || caps.max_positions >= 9));
  reach.push_back(production && prefill && !caps.full_window_only &&
                  (caps.max_positions == 0 || caps.max_positions > 100'000 + 4096 + 4));
  // Two requests live at once need two states; drafts end unaccepted by a finish or a reset.
  reach.push_back(caps.verify && two_states);
  reach.push_back(caps.verify && (caps.finish || caps.reset));
  // Trims.
  reach.push_back(can(Feature::kTrim));
  reach.push_back(can(Feature::kTrim) && caps.verify);
  // A cache with a block size: frees by its window (reached when one
  // slides); reuse seen in the slots it reports, on two states or a
  // finish; a straddling verify by its slots or positions.
  const bool paged = caps.block_size > 0;
  reach.push_back(paged && !caps.full_window_only);
  reach.push_back(paged && caps.reports_written_slots && caps.finish);
  reach.push_back(paged && caps.verify);
  // A window per layer. A global layer beside a sliding one is not
  // reachable in the production profile: a global layer's reads are the
  // whole request, past any production case's work budget, so the case
  // keeps one window (generate_production).
  reach.push_back(can(Feature::kLayerWindows) && !production);
  reach.push_back(can(Feature::kLayerWindows));
  // Shared prefixes: live sharing needs two states; a write into the block a
  // prefix ends in needs a prefix that ends inside a block (blocks of two
  // rows or more); a window frees a block only where one slides.
  const bool prefix = can(Feature::kPrefix);
  reach.push_back(prefix && two_states);
  reach.push_back(prefix && caps.finish);
  reach.push_back(prefix && caps.block_size > 1);
  reach.push_back(prefix && two_states && !caps.full_window_only);
  reach.push_back(prefix && can(Feature::kTrim));
  // Pool pressure: evictions where kvcheck sizes the pool (a paged cache's
  // pool_blocks), seen in the slots the cache reports.
  const bool pressure = can(Feature::kPoolPressure) && paged && caps.reports_written_slots;
  reach.push_back(pressure);
  reach.push_back(pressure);
  // Preemption: a resume, and one a held or cached row served (a cache that
  // keeps a preempted request's rows: a prefix cache's cached blocks).
  reach.push_back(can(Feature::kPreempt));
  reach.push_back(can(Feature::kPreempt) && (caps.reports_cached || caps.prefix_sharing));
  // A cache that recomputes a begin's rows in a step, where begins carry rows.
  reach.push_back(caps.recompute_in_step && (prefix || can(Feature::kPreempt)));
  // One pool across layers: a slot one layer released that another then
  // wrote, seen in the frees and written slots the cache reports.
  reach.push_back(caps.shared_pool && can(Feature::kLayers) && caps.reports_frees &&
                  caps.reports_written_slots);
  KVCHECK_ASSERT(reach.size() == kScheduleClassCount);
  for (int f = 0; f < kFeatureCount; ++f) reach.push_back(drawable[static_cast<std::size_t>(f)]);
  for (int a = 0; a < kFeatureCount; ++a) {
    for (int b = a + 1; b < kFeatureCount; ++b) {
      reach.push_back(drawable[static_cast<std::size_t>(a)] && drawable[static_cast<std::size_t>(b)]);
    }
  }
  // The cache's own kernel paths, last: gated where the profile draws the
  // shapes that take them (the production profile's head_dim 128 bf16/fp8
  // pools, batches and windows past one split); counted everywhere.
  reach.insert(reach.end(), caps.kernel_paths.size(), production);
  return reach;
}

namespace {

/// Swarm: which step kinds are on, and their weights (some zero), limited to
/// what the cache runs (no extra draws, so a full-featured cache keeps its cases).
void draw_weights(Prng& rng, const engines::Capabilities& caps, int (&weights)[kKinds]) {
  for (int i = 0; i < kKinds; ++i) {
    weights[i] = i != kTrim && i != kPreempt && rng.chance(2, 3) ? static_cast<int>(rng.range(1, 4)) : 0;
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

/// Minimum safe ring for these bounds (docs/semantics.md "Safe capacity"), before slack.
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

/// What the parts of a case see and shape while it is drawn.
struct CaseDraw {
  Scenario& sc;
  const engines::Capabilities& caps;
  int (&weights)[kKinds];
  std::int64_t max_chunk = 1;
  std::int64_t max_drafts = 0;
};

/// The sizes a case is drawn within; a part may change them before the
/// configuration is drawn (long runs: more requests, windows of blocks).
struct CaseSizes {
  std::int64_t block = 0;        ///< > 0: windows of 1..3 such blocks, chunks up to a window and a block
  std::int64_t min_requests = 1, max_requests = 3;
  std::int64_t min_steps = 6, max_steps = 28;
  std::int64_t min_states = 1, max_states = 3;
  std::int64_t most_drafts = 4;  ///< verify bound drawn in 1..most_drafts
};

/// The schedule as a part sees it while it is drawn.
struct ScheduleView {
  const scenarios::RequestLifecycle& lifecycle;
  std::int64_t request_count;
  std::int64_t max_positions;
};

/// One feature's part of the generator: its sizes, its configuration, the
/// steps it places and what it adds after the schedule. Each part draws from
/// its own stream (mixed from the case's data seed), so a part's draws never
/// shift another's. A case composes the parts of the features it drew.
class FeaturePart {
 public:
  virtual ~FeaturePart() = default;
  /// Before the configuration is drawn.
  virtual void sizes(CaseSizes& /*sizes*/, CaseDraw& /*draw*/) {}
  /// After the configuration and step bounds are drawn, before the schedule.
  virtual void configure(CaseDraw& /*draw*/) {}
  /// The step drawn for request `r` (begun: `started`): may replace it.
  virtual void replace_step(CaseDraw& /*draw*/, const ScheduleView& /*view*/, bool /*started*/, Step& /*step*/) {}
  /// At request `r`'s first step: the positions of a shared prefix it begins
  /// from (0: none), set on the request.
  virtual std::int64_t begin_from(CaseDraw& /*draw*/, const ScheduleView& /*view*/, std::int64_t /*r*/,
                                  const Step& /*step*/) {
    return 0;
  }
  /// After `step` of request `r` was placed.
  virtual void placed(const ScheduleView& /*view*/, std::int64_t /*r*/, const Step& /*step*/) {}
  /// After the schedule.
  virtual void finish(CaseDraw& /*draw*/) {}
};

/// Trims: how far below the highest row a request wrote (since it began or
/// reset) a trim may take it. A deep case grows the ring by that depth, so
/// the rows a query needs after a trim are still held (docs/semantics.md
/// "Safe capacity", with the depth in place of the chunk) and a trim may
/// drop a pending verify's drafts; a shallow case's trims reach only as
/// deep as the drawn ring's slack allows, so its ring (and how often it
/// wraps) stays as drawn. A begun request's step is sometimes a trim instead.
class TrimPart final : public FeaturePart {
 public:
  /// How deep a case's trims go: the trim profile's always deep (a trim one
  /// step in four), the paged and production profiles' shallow (their rings
  /// stay as drawn: long runs, and production cases whose work budget
  /// cannot lengthen the schedule), the others' either (a trim one step in
  /// eight).
  enum class Depth : std::uint8_t { kDeep, kEither, kShallow };
  TrimPart(std::uint64_t data_seed, Depth depth) : rng_(mix_seed(data_seed, 0x7472696d)), depth_kind_(depth) {}  // "trim"
  void sizes(CaseSizes& s, CaseDraw& /*d*/) override {
    // A trim takes a step and rewinds: more steps, so requests still reach
    // past the ring as often as without trims.
    s.min_steps += 6;
    s.max_steps += 24;
  }
  void configure(CaseDraw& d) override {
    const std::int64_t keys = window_keys(d.sc.cache);
    const std::int64_t drawn = d.max_drafts + 1 + rng_.range(1, keys + 2);
    const bool coin = rng_.chance(1, 2);
    if (depth_kind_ == Depth::kDeep || (depth_kind_ == Depth::kEither && coin)) {
      depth_ = drawn;
      d.sc.cache.ring_rows += depth_;
    } else {
      depth_ = d.sc.cache.ring_rows - keys + 1;  // S >= W - 1 + (H - T) as drawn
    }
  }
  void replace_step(CaseDraw& /*d*/, const ScheduleView& view, bool started, Step& step) override {
    if (!started) return;
    const scenarios::RequestProgress& progress = view.lifecycle.progress(step.request);
    // At most `depth` below the highest row written (a pending verify's included).
    const std::int64_t top = std::max(high_[step.request], progress.speculative_length());
    const std::int64_t most = std::min(progress.length, depth_ - (top - progress.length));
    // One step in four under the trim profile; elsewhere one in eight, so
    // requests still reach past the ring about as often as without trims.
    if (most >= 1 && rng_.chance(1, depth_kind_ == Depth::kDeep ? 4 : 8)) {
      const std::int64_t r = step.request;
      step = Step{StepKind::kTrim, r};
      step.positions = rng_.range(1, most);
    }
  }
  void placed(const ScheduleView& view, std::int64_t r, const Step& step) override {
    const std::int64_t reached = view.lifecycle.progress(r).speculative_length();
    high_[r] = step.kind == StepKind::kReset ? 0 : std::max(high_[r], reached);
  }

 private:
  Prng rng_;
  Depth depth_kind_;
  std::int64_t depth_ = 0;
  std::map<std::int64_t, std::int64_t> high_;  // request -> one past the highest row written since begin/reset
};

/// Shared prefixes: up to 4 requests on at least two states (where the
/// cache has them); a request's first step often begins it from the prefix
/// of a request that has begun, live or finished: all of its committed
/// positions or fewer.
class PrefixPart final : public FeaturePart {
 public:
  explicit PrefixPart(std::uint64_t data_seed) : rng_(mix_seed(data_seed, 0x70726678)) {}  // "prfx"
  void sizes(CaseSizes& s, CaseDraw& d) override {
    // Four requests, and more steps: a request from a prefix writes fewer
    // rows of its own, so requests still reach past the ring as often.
    s.max_requests = std::max<std::int64_t>(s.max_requests, 4);
    s.min_steps += 2;
    s.max_steps += 8;
    if (d.caps.max_states == 0 || d.caps.max_states >= 2) s.min_states = std::max<std::int64_t>(s.min_states, 2);
    s.max_states = std::max(s.max_states, s.min_states);
  }
  std::int64_t begin_from(CaseDraw& d, const ScheduleView& view, std::int64_t r, const Step& step) override {
    // Requests with committed rows to start from (live or finished).
    std::vector<std::int64_t> sources;
    for (std::int64_t o = 0; o < view.request_count; ++o) {
      if (o != r && view.lifecycle.phase(o) != scenarios::RequestLifecycle::Phase::kIdle &&
          view.lifecycle.progress(o).length >= 1)
        sources.push_back(o);
    }
    if (sources.empty() || !rng_.chance(3, 4)) return 0;
    const std::int64_t o = sources[static_cast<std::size_t>(rng_.below(sources.size()))];
    const std::int64_t length = view.lifecycle.progress(o).length;
    const std::int64_t n = rng_.chance(1, 3) ? length : rng_.range(1, length);
    const std::int64_t room = view.max_positions > 0 ? view.max_positions - n : 1;
    if (room <= 0 && scenarios::step_rows(step) > 0) return 0;
    d.sc.requests[static_cast<std::size_t>(r)].prefix = scenarios::Prefix{o, n};
    return n;
  }

 private:
  Prng rng_;
};

/// A window per layer, for a cache that declares per_layer_windows: 2..4
/// layers, each sliding (the case's window, or a narrower one) or global
/// (one in three), layer 1 unlike layer 0; drawn after the schedule. A
/// global layer sees every position, so the ring then holds the longest
/// request (a global layer never frees a row); narrower sliding windows
/// keep the drawn ring safe.
class LayerWindowsPart final : public FeaturePart {
 public:
  /// `globals`: global layers drawn in every case (the layers profile), else
  /// in one in six (a global layer's ring holds the whole request, so a
  /// case with one never wraps).
  LayerWindowsPart(std::uint64_t data_seed, bool globals)
      : rng_(mix_seed(data_seed, 0x6c617972)), globals_(globals) {}  // "layr"
  void finish(CaseDraw& d) override {
    const bool globals = globals_ || rng_.chance(1, 6);
    auto& c = d.sc.cache;
    std::int32_t most = 4;
    if (d.caps.max_layers > 0) most = static_cast<std::int32_t>(std::min<std::int64_t>(most, d.caps.max_layers));
    if (most < 2) return;
    c.layers = static_cast<std::int32_t>(rng_.range(2, most));
    const std::int64_t keys = window_keys(c);
    // A sliding layer's window in the cache's convention, keys 1..keys.
    auto sliding = [&](std::int64_t k) {
      return scenarios::LayerWindow{c.convention == scenarios::Convention::kKeys ? k : k - 1, c.convention};
    };
    const std::int64_t lowest_keys = c.convention == scenarios::Convention::kKeys ? 1 : 2;
    c.layer_windows.clear();
    for (std::int32_t l = 0; l < c.layers; ++l) {
      scenarios::LayerWindow w;
      if (rng_.chance(1, 3) && globals) {
        w = scenarios::LayerWindow{std::nullopt, scenarios::Convention::kKeys};
      } else {
        w = sliding(rng_.chance(1, 2) || keys <= lowest_keys ? keys : rng_.range(lowest_keys, keys));
      }
      if (l == 1 && w == c.layer_windows[0]) {
        // Layer 1 differs from layer 0: a window taken from the wrong layer
        // shows (without globals: a narrower one where there is one).
        if (!c.layer_windows[0].window) {
          w = sliding(keys);
        } else if (globals || keys <= lowest_keys) {
          w = scenarios::LayerWindow{std::nullopt, scenarios::Convention::kKeys};
        } else {
          w = sliding(rng_.range(lowest_keys, keys - 1));
        }
      }
      c.layer_windows.push_back(w);
    }
    // Explicit rows name layers: none are drawn by the generator.
    if (scenarios::has_global_layer(c))
      c.ring_rows = std::max(c.ring_rows, scenarios::schedule_end(d.sc.steps, d.sc.requests));
  }

 private:
  Prng rng_;
  bool globals_ = false;
};

/// Long runs over a shared pool: windows of one to three blocks (the
/// cache's block size, else 4; 48 keys at most), one in four inside one
/// block, chunks up to a window and a block, up to 8 requests over 20..48
/// steps on 2..4 states; finish and verify on wherever the cache runs them.
/// Requests wait for a state, finish or reset at any length (long and short
/// ones), and the next takes the freed slots or blocks; verifies straddle
/// blocks.
class LongRunsPart final : public FeaturePart {
 public:
  void sizes(CaseSizes& s, CaseDraw& d) override {
    if (d.caps.finish) d.weights[kFinish] = 1;
    if (d.caps.verify) d.weights[kVerify] = std::max(d.weights[kVerify], 2);
    s.block = d.caps.block_size > 0 ? d.caps.block_size : 4;
    s.max_requests = 8;
    s.min_steps = 20;
    s.max_steps = 48;
    s.min_states = 2;
    s.max_states = 4;
    s.most_drafts = 6;
  }
};

/// Pool pressure on a prefix cache (a cache that reports cached rows,
/// docs/semantics.md "Cached rows"): 4..8 requests on at most two states,
/// windows and chunks of the cache's blocks (a paged cache), finish on, so
/// requests fill blocks and end one after another and the cache's free pool
/// turns over (cached blocks evicted by later writes); a request's first
/// step often begins it from the prefix of the request that finished
/// longest ago (its blocks the least recently cached: a block pool's first
/// to go), n a multiple of the block size where the source wrote a whole
/// block (full blocks are the ones a prefix cache keeps). Kvcheck's pool is
/// not tightened: cached blocks are free capacity, so the pool it gives is
/// already all the room a correct cache has.
class PoolPressurePart final : public FeaturePart {
 public:
  explicit PoolPressurePart(std::uint64_t data_seed) : rng_(mix_seed(data_seed, 0x70726573)) {}  // "pres"
  void sizes(CaseSizes& s, CaseDraw& d) override {
    if (d.caps.finish) d.weights[kFinish] = 1;
    s.min_requests = std::max<std::int64_t>(s.min_requests, 4);
    s.max_requests = std::max<std::int64_t>(s.max_requests, 8);
    s.min_steps += 8;
    s.max_steps += 24;
    s.max_states = std::max(s.min_states, std::min<std::int64_t>(s.max_states, 2));
    // Windows and chunks of the cache's blocks (a long run's sizes), so
    // requests fill whole blocks, and the pool turns over, at any block size.
    if (d.caps.block_size > 0) s.block = d.caps.block_size;
  }
  std::int64_t begin_from(CaseDraw& d, const ScheduleView& view, std::int64_t r, const Step& step) override {
    std::vector<std::int64_t> sources;  // finished, in finish order, with rows
    for (const std::int64_t o : finished_) {
      if (view.lifecycle.progress(o).length >= 1) sources.push_back(o);
    }
    if (sources.empty() || !rng_.chance(3, 4)) return 0;
    const std::int64_t o =
        rng_.chance(3, 4) ? sources.front() : sources[static_cast<std::size_t>(rng_.below(sources.size()))];
    const std::int64_t length = view.lifecycle.progress(o).length;
    const std::int64_t block = d.caps.block_size > 0 ? d.caps.block_size : 4;
    const std::int64_t n = length >= block ? block * rng_.range(1, length / block) : rng_.range(1, length);
    const std::int64_t room = view.max_positions > 0 ? view.max_positions - n : 1;
    if (room <= 0 && scenarios::step_rows(step) > 0) return 0;
    d.sc.requests[static_cast<std::size_t>(r)].prefix = scenarios::Prefix{o, n};
    return n;
  }
  void placed(const ScheduleView& /*view*/, std::int64_t r, const Step& step) override {
    if (step.kind == StepKind::kFinish) finished_.push_back(r);
  }

 private:
  Prng rng_;
  std::vector<std::int64_t> finished_;  // requests in the order they finished
};

/// Preemption (docs/semantics.md "Preemption"), for a cache that declares
/// it: a begun request with committed rows is preempted (its step replaced
/// by a preempt) one step in six, one in three under pool pressure (where a
/// scheduler preempts: the pool is short of blocks); its next step resumes it.
class PreemptPart final : public FeaturePart {
 public:
  PreemptPart(std::uint64_t data_seed, bool pressure)
      : rng_(mix_seed(data_seed, 0x7072656d)), pressure_(pressure) {}  // "prem"
  void sizes(CaseSizes& s, CaseDraw& /*d*/) override {
    // A preempt takes a step: more steps, so requests still reach past the ring.
    s.min_steps += 2;
    s.max_steps += 8;
  }
  void replace_step(CaseDraw& /*d*/, const ScheduleView& view, bool started, Step& step) override {
    if (!started || view.lifecycle.progress(step.request).length < 1) return;
    if (rng_.chance(1, pressure_ ? 3 : 6)) step = Step{StepKind::kPreempt, step.request};
  }

 private:
  Prng rng_;
  bool pressure_ = false;
};

/// The features of a case: each drawable one on in about half the cases
/// (the profile's own always), from their own stream.
FeatureSet draw_feature_mask(std::uint64_t data_seed, const engines::Capabilities& caps, Profile profile) {
  const FeatureSet drawable = drawable_features(caps, profile);
  Prng rng(mix_seed(data_seed, 0x7377726d));  // "swrm"
  FeatureSet on;
  const auto draw = [&](Feature f, bool emphasized) {
    const bool coin = rng.chance(1, 2);  // drawn for every row, so one row's emphasis shifts no other
    on[static_cast<std::size_t>(f)] = drawable[static_cast<std::size_t>(f)] && (emphasized || coin);
  };
  draw(Feature::kTrim, profile == Profile::kTrim);
  draw(Feature::kPrefix, profile == Profile::kPrefix);
  draw(Feature::kLayerWindows, profile == Profile::kLayers);
  // Long runs are the paged profile's preset; elsewhere one case in four.
  const bool long_coin = rng.chance(1, 2);
  on[static_cast<std::size_t>(Feature::kLongRuns)] =
      drawable[static_cast<std::size_t>(Feature::kLongRuns)] && (profile == Profile::kPaged || (long_coin && rng.chance(1, 2)));
  // Drawn last: the rows above keep their draws.
  draw(Feature::kPoolPressure, false);
  // After it: the rows above keep their draws. Under pool pressure always
  // (where a scheduler preempts), else in about half the cases.
  draw(Feature::kPreempt, on[static_cast<std::size_t>(Feature::kPoolPressure)]);
  return on;
}

/// The parts of the features in `on`, in the order they act.
std::vector<std::unique_ptr<FeaturePart>> make_parts(const FeatureSet& on, std::uint64_t data_seed, Profile profile) {
  std::vector<std::unique_ptr<FeaturePart>> parts;
  if (on[static_cast<std::size_t>(Feature::kLongRuns)]) parts.push_back(std::make_unique<LongRunsPart>());
  if (on[static_cast<std::size_t>(Feature::kTrim)])
    parts.push_back(std::make_unique<TrimPart>(data_seed, profile == Profile::kTrim    ? TrimPart::Depth::kDeep
                                                          : profile == Profile::kPaged || profile == Profile::kProduction
                                                              ? TrimPart::Depth::kShallow
                                                                                       : TrimPart::Depth::kEither));
  // Before the prefix part: a begin it places wins.
  if (on[static_cast<std::size_t>(Feature::kPoolPressure)])
    parts.push_back(std::make_unique<PoolPressurePart>(data_seed));
  if (on[static_cast<std::size_t>(Feature::kPrefix)]) parts.push_back(std::make_unique<PrefixPart>(data_seed));
  if (on[static_cast<std::size_t>(Feature::kLayerWindows)])
    parts.push_back(std::make_unique<LayerWindowsPart>(data_seed, profile == Profile::kLayers));
  // After the trim part: a step it made a trim may still become a preempt.
  if (on[static_cast<std::size_t>(Feature::kPreempt)])
    parts.push_back(
        std::make_unique<PreemptPart>(data_seed, on[static_cast<std::size_t>(Feature::kPoolPressure)]));
  return parts;
}

/// Draws the requests (1..max_requests, each on a state id) and a schedule of
/// `min_steps`..`max_steps` steps over them; with `work`, every step is
/// fitted to what is left of the budget and the schedule ends when nothing
/// fits. The parts may replace a step (a trim) or begin a request from a
/// prefix.
void draw_schedule(Prng& rng, CaseDraw& d, const CaseSizes& sizes, WorkLeft* work,
                   const std::vector<std::unique_ptr<FeaturePart>>& parts) {
  Scenario& sc = d.sc;
  const auto& weights = d.weights;
  const auto& c = sc.cache;
  const std::int64_t max_positions = d.caps.max_positions;
  const std::int64_t request_count = rng.range(sizes.min_requests, sizes.max_requests);
  for (std::int64_t r = 0; r < request_count; ++r) {
    sc.requests.push_back({r, static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(c.states)))});
  }

  // Who has begun, finished and holds which state: scenarios::RequestLifecycle.
  scenarios::RequestLifecycle lifecycle;
  const ScheduleView view{lifecycle, request_count, max_positions};
  const auto state_of = [&](std::int64_t r) { return sc.requests[static_cast<std::size_t>(r)].state; };
  const std::int64_t budget = rng.range(sizes.min_steps, sizes.max_steps);
  // Decisions from their own stream: whether this case lets other requests
  // step while a verify is pending (seven cases in eight: the eighth keeps
  // verify, accept and the next step together, as a bug that needs them
  // adjacent wants), each time it may; and a finish or reset ending a
  // pending verify's drafts.
  Prng extra(mix_seed(sc.data.seed, 0x70656e64));  // "pend"
  const bool interleave = extra.chance(7, 8);
  const bool end_pending = weights[kFinish] + weights[kReset] > 0;
  for (std::int64_t s = 0; s < budget; ++s) {
    // Requests that may take a step now.
    std::vector<std::int64_t> ready;
    for (std::int64_t r = 0; r < request_count; ++r) {
      if (lifecycle.phase(r) == scenarios::RequestLifecycle::Phase::kFinished) continue;
      if (lifecycle.may_hold(r, state_of(r))) ready.push_back(r);
    }
    if (ready.empty()) break;
    std::int64_t r = ready[static_cast<std::size_t>(rng.below(ready.size()))];
    if (lifecycle.progress(r).pending() && ready.size() > 1 && interleave && extra.chance(3, 4)) {
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
          step.rows = rng.chance(1, 2) ? d.max_chunk : rng.range(1, d.max_chunk);
          break;
        case scenarios::StepFields::kDrafts: step.drafts = rng.range(0, d.max_drafts); break;
        case scenarios::StepFields::kAccepted:
        case scenarios::StepFields::kPositions:
        case scenarios::StepFields::kNone: break;
      }
      // A finish or reset of a request that has not begun would do nothing: a decode instead.
      if (scenarios::step_kind_needs_begun(step.kind) && !started) step = Step{StepKind::kDecode, r};
    }
    for (const auto& part : parts) part->replace_step(d, view, started, step);
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
    if (!started) {
      for (const auto& part : parts) {
        if (prefix_positions == 0) prefix_positions = part->begin_from(d, view, r, step);
      }
    }
    // Begins the request (at its prefix's length), advances it, frees its state at finish.
    lifecycle.step(r, state_of(r), step, prefix_positions);
    for (const auto& part : parts) part->placed(view, r, step);
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

/// Last touches shared by every profile, then validation.
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

/// The small shapes of the default sizes: 1..2 KV heads in groups of 1..2,
/// head_dim 2..8, formats, RoPE, layers and sink.
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

/// A scenario named for `profile`'s case from `seed` ("trim-7", "kvcheck
/// check --profile trim case drawn from seed 7"; the default profile's:
/// "generated-7", "kvcheck check case drawn from seed 7"), with its data
/// seed and swarm weights drawn.
Scenario begin_profile_scenario(Prng& rng, Profile profile, std::uint64_t seed, const engines::Capabilities& caps,
                                int (&weights)[kKinds]) {
  const std::string n = std::to_string(seed);
  Scenario sc;
  if (profile == Profile::kDefault) {
    sc.name = "generated-" + n;
    sc.description = "kvcheck check case drawn from seed " + n;
  } else {
    const std::string name = profile_name(profile);
    sc.name = name + "-" + n;
    sc.description = "kvcheck check --profile " + name + " case drawn from seed " + n;
  }
  sc.data.seed = rng.next() >> 1;
  draw_weights(rng, caps, weights);
  return sc;
}

/// The small-case profiles (default, trim, layers, prefix, paged): the
/// features drawn for the case, their parts composed over the default's
/// sizes (or a long run's).
Scenario generate_small(std::uint64_t seed, const engines::Capabilities& caps, Profile profile) {
  Prng rng(seed);
  int weights[kKinds];
  Scenario sc = begin_profile_scenario(rng, profile, seed, caps, weights);
  const FeatureSet on = draw_feature_mask(sc.data.seed, caps, profile);
  const auto parts = make_parts(on, sc.data.seed, profile);
  CaseDraw d{sc, caps, weights};
  CaseSizes sizes;
  for (const auto& part : parts) part->sizes(sizes, d);

  auto& c = sc.cache;
  if (sizes.block > 0) {
    // Windows of up to three blocks (48 keys at most), one in four inside one block.
    const std::int64_t widest = std::min<std::int64_t>(3 * sizes.block, 48);
    const std::int64_t narrow = std::min(sizes.block, widest);
    c.window = rng.chance(1, 4) ? rng.range(1, narrow) : rng.range(narrow, widest);
  } else {
    c.window = rng.range(1, 7);
  }
  c.convention = draw_convention(rng);
  fit_window(c, caps);
  const std::int64_t keys = window_keys(c);
  d.max_drafts = weights[kVerify] ? rng.range(1, sizes.most_drafts) : 0;
  const bool prefill_on = weights[kPrefillLts] + weights[kPrefillStl] > 0;
  // Chunks up to two windows and two rows (a long run's: a window and a
  // block, so prefills cross blocks and free them).
  const std::int64_t longest_chunk = sizes.block > 0 ? keys + sizes.block : 2 * keys + 2;
  d.max_chunk = prefill_on ? rng.range(1, longest_chunk) : 1;
  fit_step_bounds(caps, &d.max_chunk, &d.max_drafts);
  // Minimum safe ring for these bounds (docs/semantics.md "Safe capacity"), then 0..3 rows of slack.
  const std::int64_t safe = safe_ring_rows(keys, d.max_chunk, d.max_drafts, weights[kPrefillStl] > 0);
  c.ring_rows = safe + small_slack(rng);
  c.states = rng.range(sizes.min_states, sizes.max_states);
  draw_small_shape(rng, c);
  fit_to_caps(c, caps);
  for (const auto& part : parts) part->configure(d);
  draw_schedule(rng, d, sizes, nullptr, parts);
  for (const auto& part : parts) part->finish(d);
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
/// position 10^5 (where angle errors grow: docs/tolerances) in prefill
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
  c.layer_windows.clear();
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

/// The reference's multiply-adds for `sc`: per query, the rows each layer's
/// window shows it, times query heads and head_dim (WorkLeft's measure, per
/// layer).
std::int64_t reference_macs(const Scenario& sc) {
  const auto& c = sc.cache;
  std::int64_t macs = 0;
  std::map<std::int64_t, scenarios::RequestProgress> progress = scenarios::start_progress(sc.requests);
  for (const Step& step : sc.steps) {
    scenarios::RequestProgress& p = progress[step.request];
    const std::int64_t first = scenarios::step_first_position(p);
    const std::int64_t rows = scenarios::step_rows(step);
    for (std::int64_t q = first; q < first + rows; ++q) {
      for (std::int32_t l = 0; l < c.layers; ++l) {
        macs += std::min(q + 1, scenarios::layer_window_keys(c, l)) * c.q_heads * c.head_dim;
      }
    }
    scenarios::advance(p, step);
  }
  return macs;
}

Scenario generate_production(std::uint64_t seed, const engines::Capabilities& caps) {
  Prng rng(mix_seed(seed, 0x70726f64));  // "prod": its own stream, apart from the default profile's
  int weights[kKinds];
  Scenario sc = begin_profile_scenario(rng, Profile::kProduction, seed, caps, weights);
  const ProductionBudget budget = production_budget();
  const FeatureSet on = draw_feature_mask(sc.data.seed, caps, Profile::kProduction);
  const auto parts = make_parts(on, sc.data.seed, Profile::kProduction);
  CaseDraw d{sc, caps, weights};
  CaseSizes sizes;
  sizes.max_requests = 4;
  sizes.min_steps = 4;
  sizes.max_steps = 24;
  for (const auto& part : parts) part->sizes(sizes, d);

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
  d.max_drafts = weights[kVerify] ? rng.range(1, 16) : 0;
  const bool prefill_on = weights[kPrefillLts] + weights[kPrefillStl] > 0;
  d.max_chunk = prefill_on ? (rng.chance(1, 2) ? rng.range(1, 2048) : rng.range(1, 64)) : 1;
  if (narrow && prefill_on) d.max_chunk = rng.range(1024, 2048);
  fit_step_bounds(caps, &d.max_chunk, &d.max_drafts);
  const std::int64_t safe = safe_ring_rows(keys, d.max_chunk, d.max_drafts, weights[kPrefillStl] > 0);
  const std::uint64_t slack_draw = rng.below(8);
  c.ring_rows =
      safe +
      (slack_draw < 5 ? 0 : (slack_draw < 7 ? static_cast<std::int64_t>(slack_draw) - 4 : rng.range(3, 64)));
  c.states = rng.range(1, 4);
  if (on[static_cast<std::size_t>(Feature::kPrefix)] && (caps.max_states == 0 || caps.max_states >= 2))
    c.states = std::max<std::int64_t>(c.states, 2);
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
  for (const auto& part : parts) part->configure(d);
  // The pool within its budget: fewer states first, then fewer KV heads
  // (same group), then one layer (one state, one KV head and one layer of
  // the widest draw is 8193 + 2048 + 16 + 64 rows of 2 KiB: 21 MiB). A
  // window per layer comes after the schedule: it may grow the ring for a
  // global layer, and then shrinks the pool again.
  const auto pool_bytes = [&c] {
    return std::int64_t{c.layers} * c.states * c.ring_rows * slot_bytes(c);
  };
  const auto fit_pool = [&] {
    while (pool_bytes() > budget.pool_bytes) {
      if (c.states > 1 && !(on[static_cast<std::size_t>(Feature::kPrefix)] && c.states <= 2)) {
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
  };
  fit_pool();
  WorkLeft work(c, budget);
  draw_schedule(rng, d, sizes, &work, parts);
  // One case in sixteen is a long-context one, decided from its own stream
  // (so how many draws the schedule took does not move it).
  Prng long_rng(mix_seed(sc.data.seed, 0x6c6f6e67));  // "long"
  const bool prefill = caps.prefill_load_then_store || caps.prefill_store_then_load;
  const bool long_fits = caps.max_positions == 0 || caps.max_positions > kLongContextRows + 4096 + 4;
  if (prefill && !caps.full_window_only && long_rng.chance(1, 16) && long_fits) {
    make_long_context(sc, long_rng, caps);
  } else {
    const std::int64_t ring_before = c.ring_rows;
    const std::int32_t layers_before = c.layers;
    for (const auto& part : parts) part->finish(d);
    if (!c.layer_windows.empty() && (pool_bytes() > budget.pool_bytes || reference_macs(sc) > budget.reference_macs)) {
      // A window per layer is drawn after the schedule, which was fitted to
      // the budget for its layers of one window: more layers, or a global
      // layer's whole request, over the budget (its ring, or the
      // reference's work), and the case keeps its one window.
      c.layer_windows.clear();
      c.layers = layers_before;
      c.ring_rows = ring_before;
    }
  }
  finish_scenario(sc, caps);
  return sc;
}

}  // namespace

Scenario generate_scenario(std::uint64_t seed, const engines::Capabilities& caps, Profile profile) {
  return profile == Profile::kProduction ? generate_production(seed, caps) : generate_small(seed, caps, profile);
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
  std::map<std::int64_t, std::int64_t> prefix_left;  // request -> the shared prefix it began from, until a reset
  for (const auto& r : sc.requests) {
    if (r.prefix) prefix_left[r.id] = r.prefix->positions;
  }
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
      // Back below the shared prefix it began from (no reset since).
      const auto shared = prefix_left.find(s.request);
      if (shared != prefix_left.end() && p.length - s.positions < shared->second) cov.trim_into_prefix = true;
    }
    if (s.kind == StepKind::kReset) prefix_left.erase(s.request);
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
  cov.features = exercised_features(sc);
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

void classify_cached(const RunObservation& run, Coverage* cov) {
  for (const StepObservation& o : run.steps) {
    if (o.layer == 0 && o.evicted_rows > 0) cov->cached_block_evicted = true;
  }
  for (const PrefixObservation& p : run.prefixes) {
    if (p.evicted_positions > 0) cov->begin_from_evicted_prefix = true;
  }
  if (run.resumes > 0) cov->preempt_then_resume = true;
  if (run.resumes_with_hits > 0) cov->resume_with_prefix_hit = true;
  if (run.steps_recomputing > 0) cov->prefix_recomputed_in_step = true;
  if (run.slots_across_layers > 0) cov->slot_across_layers = true;
}

}  // namespace kvcheck::properties
