#include <algorithm>
#include <cstring>
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

bool Capabilities::supports(const scenarios::CacheConfig& c, std::int64_t step_rows, std::string* why) const {
  auto no = [why](std::string text) {
    if (why) *why = std::move(text);
    return false;
  };
  if (!contains(formats, c.format))
    return no("element format " + std::string(scenarios::format_name(c.format)));
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
  if (max_head_dim > 0 && c.head_dim > max_head_dim) return no("head_dim " + std::to_string(c.head_dim));
  if (max_heads > 0 && c.q_heads > max_heads) return no(std::to_string(c.q_heads) + " query heads");
  if (max_step_rows > 0 && step_rows > max_step_rows) {
    return no("steps of " + std::to_string(step_rows) + " rows (most " + std::to_string(max_step_rows) + ")");
  }
  return true;
}

bool Capabilities::supports_step(const scenarios::Step& s) const noexcept {
  switch (s.kind) {
    case scenarios::StepKind::kPrefill:
      return s.order == scenarios::Order::kLoadThenStore ? prefill_load_then_store : prefill_store_then_load;
    case scenarios::StepKind::kDecode: return decode;
    case scenarios::StepKind::kVerify:
    case scenarios::StepKind::kAccept: return verify;
    case scenarios::StepKind::kFinish: return finish;
    case scenarios::StepKind::kReset: return reset;
  }
  return false;
}

bool Capabilities::supports(const scenarios::Scenario& sc, std::string* why) const {
  std::int64_t rows = 1;
  for (const auto& s : sc.steps) rows = std::max(rows, scenarios::step_rows(s));
  if (!supports(sc.cache, rows, why)) return false;
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
    const std::int64_t end = scenarios::schedule_end(sc.steps);
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
