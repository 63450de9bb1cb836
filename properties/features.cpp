#include "properties/features.hpp"

#include <algorithm>
#include <map>

#include "scenarios/step_semantics.hpp"

namespace kvcheck::properties {

const char* feature_name(Feature feature) noexcept {
  switch (feature) {
#define KVCHECK_FEATURE_NAME(id, name, what) \
  case Feature::id: return name;
    KVCHECK_FEATURES(KVCHECK_FEATURE_NAME)
#undef KVCHECK_FEATURE_NAME
  }
  return "?";
}

const char* feature_meaning(Feature feature) noexcept {
  switch (feature) {
#define KVCHECK_FEATURE_MEANING(id, name, what) \
  case Feature::id: return what;
    KVCHECK_FEATURES(KVCHECK_FEATURE_MEANING)
#undef KVCHECK_FEATURE_MEANING
  }
  return "?";
}

namespace {

constexpr std::size_t bit(Feature f) noexcept { return static_cast<std::size_t>(f); }

bool allows(std::int64_t limit, std::int64_t at_least) noexcept { return limit == 0 || limit >= at_least; }

}  // namespace

FeatureSet drawable_features(const engines::Capabilities& caps, Profile profile) {
  FeatureSet f;
  f[bit(Feature::kVerify)] = caps.verify && allows(caps.max_positions, 2);
  f[bit(Feature::kPrefillLoadThenStore)] = caps.prefill_load_then_store;
  f[bit(Feature::kPrefillStoreThenLoad)] = caps.prefill_store_then_load;
  f[bit(Feature::kFinish)] = caps.finish;
  f[bit(Feature::kReset)] = caps.reset;
  f[bit(Feature::kTrim)] = caps.trim;
  // A prefix is taken from a request that has begun: two requests, one
  // position shared and one written after it.
  f[bit(Feature::kPrefix)] = caps.prefix_sharing && allows(caps.max_positions, 2);
  const bool layers = allows(caps.max_layers, 2);
  f[bit(Feature::kLayerWindows)] = caps.per_layer_windows && layers && !caps.full_window_only;
  // Four requests need four states, or a finish that frees one for the next;
  // the production profile spends its budget on shapes, not on long runs.
  f[bit(Feature::kLongRuns)] = profile != Profile::kProduction && (caps.finish || allows(caps.max_states, 4));
  f[bit(Feature::kLayers)] = layers;
  f[bit(Feature::kGqa)] = caps.gqa && allows(caps.max_heads, 2);
  f[bit(Feature::kSink)] = caps.sink;
  f[bit(Feature::kRope)] = std::any_of(caps.rope_styles.begin(), caps.rope_styles.end(),
                                       [](scenarios::RopeStyle s) { return s != scenarios::RopeStyle::kNone; });
  f[bit(Feature::kNarrowFormat)] = std::any_of(caps.formats.begin(), caps.formats.end(),
                                               [](scenarios::Format x) { return x != scenarios::Format::kF64; });
  f[bit(Feature::kSharedRow)] = caps.shared_row;
  // Pressure on a prefix cache's pool: a cache that keeps cached blocks
  // (docs/semantics.md "Cached rows") and finishes requests.
  f[bit(Feature::kPoolPressure)] =
      f[bit(Feature::kPrefix)] && caps.reports_cached && caps.finish && profile != Profile::kProduction;
  // Preemption (docs/semantics.md "Preemption"): a cache that declares it.
  f[bit(Feature::kPreempt)] = caps.preempt && profile != Profile::kProduction;
  return f;
}

FeatureSet exercised_features(const scenarios::Scenario& sc) {
  FeatureSet f;
  for (const scenarios::Step& s : sc.steps) {
    switch (s.kind) {
      case scenarios::StepKind::kVerify: f[bit(Feature::kVerify)] = true; break;
      case scenarios::StepKind::kPrefill:
        f[bit(s.order == scenarios::Order::kLoadThenStore ? Feature::kPrefillLoadThenStore
                                                          : Feature::kPrefillStoreThenLoad)] = true;
        break;
      case scenarios::StepKind::kFinish: f[bit(Feature::kFinish)] = true; break;
      case scenarios::StepKind::kReset: f[bit(Feature::kReset)] = true; break;
      case scenarios::StepKind::kTrim: f[bit(Feature::kTrim)] = true; break;
      case scenarios::StepKind::kPreempt: f[bit(Feature::kPreempt)] = true; break;
      default: break;
    }
  }
  f[bit(Feature::kPrefix)] = std::any_of(sc.requests.begin(), sc.requests.end(),
                                         [](const scenarios::Request& r) { return r.prefix.has_value(); });
  f[bit(Feature::kLayerWindows)] = !sc.cache.layer_windows.empty();
  f[bit(Feature::kLongRuns)] = sc.requests.size() >= 3 && sc.steps.size() >= 16;
  const auto& c = sc.cache;
  f[bit(Feature::kLayers)] = c.layers >= 2;
  f[bit(Feature::kGqa)] = c.q_heads > c.kv_heads;
  f[bit(Feature::kSink)] = c.sink_logit.has_value();
  f[bit(Feature::kRope)] = c.rope.style != scenarios::RopeStyle::kNone && c.rope.rotary_dims > 0;
  f[bit(Feature::kNarrowFormat)] = c.format != scenarios::Format::kF64;
  f[bit(Feature::kSharedRow)] = c.shared_row;
  std::int64_t finished = 0;
  for (const scenarios::Step& s : sc.steps) finished += s.kind == scenarios::StepKind::kFinish ? 1 : 0;
  // A begin from a request that finished before it (the schedule's order).
  bool from_finished = false;
  {
    scenarios::RequestLifecycle life;
    std::map<std::int64_t, const scenarios::Request*> by_id;
    for (const auto& r : sc.requests) by_id[r.id] = &r;
    for (const scenarios::Step& s : sc.steps) {
      const auto it = by_id.find(s.request);
      const scenarios::Request* req = it == by_id.end() ? nullptr : it->second;
      std::int64_t n = 0;
      if (req != nullptr && req->prefix &&
          life.phase(s.request) == scenarios::RequestLifecycle::Phase::kIdle) {
        n = req->prefix->positions;
        from_finished = from_finished ||
                        life.phase(req->prefix->request) == scenarios::RequestLifecycle::Phase::kFinished;
      }
      life.step(s.request, req != nullptr ? req->state : 0, s, n);
    }
  }
  f[bit(Feature::kPoolPressure)] = sc.requests.size() >= 4 && finished >= 3 && from_finished;
  return f;
}

}  // namespace kvcheck::properties
