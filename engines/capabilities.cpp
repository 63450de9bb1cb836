#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "engines/cache_under_test.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"

namespace kvcheck::engines {

namespace {

template <class T>
bool contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

bool SizeSet::contains(std::int64_t x) const noexcept {
  if (x < min || (max > 0 && x > max)) return false;
  if (multiple_of > 1 && x % multiple_of != 0) return false;
  return values.empty() || kvcheck::engines::contains(values, x);
}

bool SizeSet::unrestricted() const noexcept {
  return min <= 1 && max == 0 && multiple_of <= 1 && values.empty();
}

std::optional<std::int64_t> SizeSet::largest_at_most(std::int64_t x) const noexcept {
  if (!values.empty()) {
    for (auto it = values.rbegin(); it != values.rend(); ++it) {
      if (*it <= x && contains(*it)) return *it;
    }
    return std::nullopt;
  }
  if (max > 0) x = std::min(x, max);
  const std::int64_t m = std::max<std::int64_t>(multiple_of, 1);
  const std::int64_t y = x / m * m;
  if (y < min || y < 1) return std::nullopt;
  return y;
}

std::optional<std::int64_t> SizeSet::smallest_at_least(std::int64_t x) const noexcept {
  if (!values.empty()) {
    for (const std::int64_t v : values) {
      if (v >= x && contains(v)) return v;
    }
    return std::nullopt;
  }
  x = std::max({x, min, std::int64_t{1}});
  const std::int64_t m = std::max<std::int64_t>(multiple_of, 1);
  if (x > std::numeric_limits<std::int64_t>::max() - m) return std::nullopt;
  const std::int64_t y = (x + m - 1) / m * m;
  if (max > 0 && y > max) return std::nullopt;
  return y;
}

std::optional<std::int64_t> SizeSet::fit(std::int64_t x, std::int64_t limit) const {
  if (contains(x) && x <= limit) return x;
  // Halving, then doubling: a drawn power of two stays a power of two, and a
  // draw that only breaks a maximum is halved as the generator always did.
  for (std::int64_t y = x / 2; y >= 1; y /= 2) {
    if (contains(y) && y <= limit) return y;
  }
  for (std::int64_t y = x * 2; y <= limit && y > 0; y *= 2) {
    if (contains(y)) return y;
  }
  if (const auto below = largest_at_most(std::min(x, limit))) return below;
  if (const auto above = smallest_at_least(x); above && *above <= limit) return above;
  return std::nullopt;
}

std::string SizeSet::describe() const {
  if (unrestricted()) return "any";
  std::string text;
  if (!values.empty()) {
    text = "one of";
    for (std::size_t i = 0; i < values.size(); ++i) text += (i ? ", " : " ") + std::to_string(values[i]);
  } else if (multiple_of > 1) {
    text = "multiples of " + std::to_string(multiple_of);
  } else {
    text = "sizes";
  }
  if (min > 1) text += " from " + std::to_string(min);
  if (max > 0) text += " up to " + std::to_string(max);
  return text;
}

const char* accumulation_name(Accumulation a) noexcept {
  switch (a) {
    case Accumulation::kByFormat: return "format";
    case Accumulation::kF32: return "f32";
    case Accumulation::kF64: return "f64";
  }
  return "format";
}

const char* probability_rounding_name(ProbabilityRounding r) noexcept {
  switch (r) {
    case ProbabilityRounding::kNone: return "none";
    case ProbabilityRounding::kBf16: return "bf16";
    case ProbabilityRounding::kFp16: return "fp16";
  }
  return "none";
}

double Capabilities::accumulation_epsilon(scenarios::Format format) const noexcept {
  switch (accumulation) {
    case Accumulation::kF32: return 0x1.0p-24;
    case Accumulation::kF64: return 0x1.0p-53;
    case Accumulation::kByFormat: break;
  }
  return format == scenarios::Format::kF64 ? 0x1.0p-53 : 0x1.0p-24;
}

double Capabilities::probability_epsilon() const noexcept {
  switch (probabilities_rounded_to) {
    case ProbabilityRounding::kNone: return 0;
    case ProbabilityRounding::kBf16: return 0x1.0p-8;
    case ProbabilityRounding::kFp16: return 0x1.0p-11;
  }
  return 0;
}

std::int64_t paged_pool_blocks(const CacheSpec& spec, std::int64_t block_size, std::int64_t slack_rows,
                               std::int64_t in_step_rows) noexcept {
  if (spec.pool_blocks > 0) return spec.pool_blocks;
  if (block_size < 1) return 0;
  // A step that recomputes a begin's rows holds them and its own at once
  // (docs/semantics.md "Recompute in a step").
  const std::int64_t in_step = in_step_rows > 0 ? in_step_rows + spec.max_step_rows : 0;
  const std::int64_t rows =
      std::max<std::int64_t>({spec.cache.ring_rows, spec.window_keys - 1 + spec.max_step_rows, in_step, 1}) +
      std::max<std::int64_t>(slack_rows, 0);
  return spec.cache.states * ((rows + block_size - 1) / block_size + 1);
}

namespace {

/// The rows a declared free deferral may keep past the windows of one
/// request: N steps of at most max_step_rows rows each.
std::int64_t deferred_rows(const Capabilities& caps, const CacheSpec& spec) noexcept {
  return caps.free_deferral_steps.value_or(0) * std::max<std::int64_t>(spec.max_step_rows, 1);
}

}  // namespace

std::int64_t pool_slack_rows(const Capabilities& caps, const CacheSpec& spec) noexcept {
  return caps.lookahead_slots + deferred_rows(caps, spec);
}

namespace {

/// The begin rows a step of the cache may store besides its own.
std::int64_t begin_rows_in_step(const Capabilities& caps, const CacheSpec& spec) noexcept {
  return caps.recompute_in_step ? spec.max_begin_rows : 0;
}

}  // namespace

std::int64_t layer_pool_blocks(const CacheSpec& spec, const Capabilities& caps, std::int32_t layer) noexcept {
  CacheSpec one = spec;
  one.pool_blocks = 0;
  // A sliding layer of its own window; a global layer is covered by the
  // capacity (a case with one holds its longest request there).
  if (layer >= 0 && static_cast<std::size_t>(layer) < spec.layer_window_keys.size()) {
    const std::int64_t keys = spec.layer_window_keys[static_cast<std::size_t>(layer)];
    if (keys != scenarios::kGlobalWindowKeys) one.window_keys = keys;
  }
  return paged_pool_blocks(one, caps.block_size, pool_slack_rows(caps, spec), begin_rows_in_step(caps, spec));
}

std::int64_t paged_pool_blocks(const CacheSpec& spec, const Capabilities& caps) noexcept {
  if (!caps.shared_pool || spec.pool_blocks > 0 || caps.block_size < 1)
    return paged_pool_blocks(spec, caps.block_size, pool_slack_rows(caps, spec),
                             begin_rows_in_step(caps, spec));
  // One pool across the layers (docs/semantics.md "One pool across layers"):
  // the sum of every layer's share.
  std::int64_t blocks = 0;
  for (std::int32_t l = 0; l < std::max<std::int32_t>(spec.cache.layers, 1); ++l)
    blocks += layer_pool_blocks(spec, caps, l);
  return blocks;
}

std::int64_t resident_limit(const Capabilities& caps, const CacheSpec& spec) noexcept {
  const ResidentBound& b = caps.resident_bound;
  if (!b.declared()) return 0;
  if (b.limit > 0) return b.limit;
  const std::int64_t states = std::max<std::int64_t>(spec.cache.states, 1);
  if (b.unit == ResidentBound::Unit::kRows) {
    // Lookahead slots hold no row; rows a deferral keeps are rows.
    // One pool across the layers: a bound over all of them together.
    const std::int64_t layers = caps.shared_pool ? std::max<std::int64_t>(spec.cache.layers, 1) : 1;
    const std::int64_t rows = layers * (spec.cache.ring_rows + deferred_rows(caps, spec));
    return b.per_request ? rows : states * rows;
  }
  const std::int64_t pool = paged_pool_blocks(spec, caps);
  return b.per_request ? pool / states : pool;
}

bool Capabilities::supports(const scenarios::CacheConfig& c, std::int64_t step_rows, std::string* why) const {
  auto no = [why](std::string text) {
    if (why) *why = std::move(text);
    return false;
  };
  if (!contains(formats, c.format)) return no("element format " + std::string(format_name(c.format)));
  if (!contains(rope_styles, c.rope.style))
    return no("RoPE style " + std::string(scenarios::rope_style_name(c.rope.style)));
  if (!partial_rope && c.rope.style != scenarios::RopeStyle::kNone && c.rope.rotary_dims != c.head_dim) {
    return no("partial RoPE (rotary_dims < head_dim)");
  }
  if (!gqa && c.q_heads != c.kv_heads) return no("grouped KV heads (q_heads != kv_heads)");
  if (!shared_row && c.shared_row) return no("shared key/value rows");
  if (!sink && c.sink_logit) return no("an attention-sink logit");
  if (!softmax_scale && c.softmax_scale) return no("a softmax_scale other than 1/sqrt(head_dim)");
  if (max_states > 0 && c.states > max_states)
    return no(std::to_string(c.states) + " states (most " + std::to_string(max_states) + ")");
  if (max_layers > 0 && c.layers > max_layers)
    return no(std::to_string(c.layers) + " layers (most " + std::to_string(max_layers) + ")");
  if (!head_dims.contains(c.head_dim)) {
    return no("head_dim " + std::to_string(c.head_dim) + " (it runs " + head_dims.describe() + ")");
  }
  if (c.rope.style != scenarios::RopeStyle::kNone && c.rope.rotary_dims > 0 &&
      !rotary_dims.contains(c.rope.rotary_dims)) {
    return no("rotary_dims " + std::to_string(c.rope.rotary_dims) + " (it runs " + rotary_dims.describe() +
              ")");
  }
  if (max_heads > 0 && c.q_heads > max_heads)
    return no(std::to_string(c.q_heads) + " query heads (most " + std::to_string(max_heads) + ")");
  if (max_kv_heads > 0 && c.kv_heads > max_kv_heads)
    return no(std::to_string(c.kv_heads) + " KV heads (most " + std::to_string(max_kv_heads) + ")");
  if (max_window_keys > 0 && scenarios::declared_window_keys(c) > max_window_keys) {
    return no("a window of " + std::to_string(scenarios::declared_window_keys(c)) + " keys (most " +
              std::to_string(max_window_keys) + ")");
  }
  if (!c.layer_windows.empty()) {
    if (!per_layer_windows) return no("a window per layer (cache.layer_windows)");
    const std::int64_t widest = scenarios::widest_sliding_window_keys(c);
    if (max_window_keys > 0 && widest != scenarios::kGlobalWindowKeys && widest > max_window_keys) {
      return no("a layer window of " + std::to_string(widest) + " keys (most " + std::to_string(max_window_keys) +
                ")");
    }
  }
  if (max_step_rows > 0 && step_rows > max_step_rows) {
    return no("steps of " + std::to_string(step_rows) + " rows (most " + std::to_string(max_step_rows) + ")");
  }
  return true;
}

bool Capabilities::runs(scenarios::StepCapability capability) const noexcept {
  switch (capability) {
#define KVCHECK_CAPABILITY_RUNS(id, member, kind, order) \
  case scenarios::StepCapability::id: return member;
    KVCHECK_STEP_CAPABILITIES(KVCHECK_CAPABILITY_RUNS)
#undef KVCHECK_CAPABILITY_RUNS
  }
  return false;
}

bool Capabilities::supports_step(const scenarios::Step& s) const noexcept {
  for (int i = 0; i < scenarios::kStepCapabilityCount; ++i) {
    const auto capability = static_cast<scenarios::StepCapability>(i);
    if (scenarios::step_capability_runs(capability, s.kind, s.order)) return runs(capability);
  }
  return false;
}

bool Capabilities::supports(const scenarios::Scenario& sc, std::string* why) const {
  std::int64_t rows = 1;
  for (const auto& s : sc.steps) rows = std::max(rows, scenarios::step_rows(s));
  if (!supports(sc.cache, rows, why)) return false;
  if (max_positions > 0) {
    const std::int64_t end = scenarios::schedule_end(sc.steps, sc.requests);
    if (end > max_positions) {
      if (why)
        *why = "positions up to " + std::to_string(end - 1) + " (most " + std::to_string(max_positions) +
               " positions per request)";
      return false;
    }
  }
  if (!prefix_sharing) {
    for (std::size_t i = 0; i < sc.requests.size(); ++i) {
      if (sc.requests[i].prefix) {
        if (why) *why = "requests[" + std::to_string(i) + "] starts from a shared prefix";
        return false;
      }
    }
  }
  for (std::size_t i = 0; i < sc.steps.size(); ++i) {
    if (!supports_step(sc.steps[i])) {
      const auto& s = sc.steps[i];
      const std::string kind = s.kind == scenarios::StepKind::kPrefill
                                   ? "prefill " + std::string(scenarios::order_name(s.order))
                                   : std::string(scenarios::step_kind_name(s.kind));
      if (why) *why = "steps[" + std::to_string(i) + "] is a " + kind + " step";
      return false;
    }
  }
  if (full_window_only) {
    // The cache sees every row it holds: the scenario must never slide its
    // window or outgrow the capacity.
    const std::int64_t end = scenarios::schedule_end(sc.steps, sc.requests);
    if (scenarios::declared_window_keys(sc.cache) < end) {
      if (why)
        *why = "positions up to " + std::to_string(end - 1) + " slide a window of " +
               std::to_string(scenarios::declared_window_keys(sc.cache)) +
               " keys (the cache attends to every row)";
      return false;
    }
    if (end > sc.cache.ring_rows) {
      if (why)
        *why = "positions up to " + std::to_string(end - 1) + " exceed the capacity " +
               std::to_string(sc.cache.ring_rows);
      return false;
    }
  }
  return true;
}

StepStatus CacheUnderTest::probe(const std::string& name, const StepCall&) {
  return Refusal{"unsupported-probe", "the cache has no probe '" + name + "'"};
}

std::optional<std::uint64_t> CacheUnderTest::fingerprint(std::int32_t) const {
  return std::nullopt;
}

std::uint64_t hash_words(const void* data, std::size_t bytes, std::uint64_t hash) noexcept {
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t lane[4] = {hash, hash ^ 0x243F6A8885A308D3ull, hash ^ 0x13198A2E03707344ull,
                           hash ^ 0xA4093822299F31D0ull};
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (int l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      lane[l] = (lane[l] ^ w) * kMul;
      lane[l] ^= lane[l] >> 32;
    }
  }
  std::uint64_t h = fnv1a(p + i, bytes - i, hash ^ bytes);  // the tail, and the length
  for (const std::uint64_t l : lane) h = ((h ^ l) * kMul) ^ (h >> 29);
  return h;
}

std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t hash) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace kvcheck::engines
