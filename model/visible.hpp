// Visible ranges for causal and sliding-window attention. Real systems
// disagree on what "window W" means, so the convention is explicit and every
// report names it:
//   kKeys      W keys, the query itself included (docs/semantics.md "Windows")
//   kLeft      the parameter is `left`: left + 1 keys (FlashAttention (left, 0))
//   kOffByOne  the parameter W shows W + 1 keys (the off-by-one engines ship)
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvcheck::model {

/// How a window parameter maps to a count of visible keys.
enum class WindowConvention : std::uint8_t { kKeys, kLeft, kOffByOne };

/// Stable name: "keys", "left", "off-by-one".
constexpr std::string_view convention_name(WindowConvention c) noexcept {
  switch (c) {
    case WindowConvention::kKeys: return "keys";
    case WindowConvention::kLeft: return "left";
    case WindowConvention::kOffByOne: return "off-by-one";
  }
  return "?";
}

/// Parses a convention name; false when unknown.
constexpr bool parse_convention(std::string_view s, WindowConvention* out) noexcept {
  for (auto c : {WindowConvention::kKeys, WindowConvention::kLeft, WindowConvention::kOffByOne}) {
    if (convention_name(c) == s) {
      *out = c;
      return true;
    }
  }
  return false;
}

/// A window parameter with its convention; no parameter means plain causal.
struct Window {
  std::optional<std::int64_t> parameter;  ///< nullopt: causal (W = inf)
  WindowConvention convention = WindowConvention::kKeys;

  /// Visible keys per query, the query included; nullopt for causal.
  constexpr std::optional<std::int64_t> keys() const noexcept {
    if (!parameter) return std::nullopt;
    switch (convention) {
      case WindowConvention::kKeys: return *parameter;
      case WindowConvention::kLeft: return *parameter + 1;
      case WindowConvention::kOffByOne: return *parameter + 1;
    }
    return *parameter;
  }
};

/// Inclusive range of absolute positions.
struct PositionRange {
  std::int64_t first = 0;
  std::int64_t last = -1;
  constexpr std::int64_t count() const noexcept { return last - first + 1; }
  constexpr bool contains(std::int64_t p) const noexcept { return p >= first && p <= last; }
};

/// Positions visible to a query at `position`: max(0, p - keys + 1) .. p.
constexpr PositionRange visible_range(std::int64_t position, const Window& window) noexcept {
  const auto keys = window.keys();
  const std::int64_t first = keys ? std::max<std::int64_t>(0, position - *keys + 1) : 0;
  return {first, position};
}

}  // namespace kvcheck::model
