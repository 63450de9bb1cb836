// The file spelling of each scenario enum (formats, conventions, RoPE
// styles, prefill orders, step kinds, value profiles).
#include "scenarios/scenario_json.hpp"

namespace kvcheck::scenarios {

std::string_view value_profile_name(ValueProfile p) noexcept {
  switch (p) {
    case ValueProfile::kUniform: return "uniform";
    case ValueProfile::kLargeLogits: return "large-logits";
    case ValueProfile::kFp8Outliers: return "fp8-outliers";
    case ValueProfile::kPositionCode: return "position-code";
  }
  return "?";
}

std::string_view convention_name(Convention c) noexcept {
  switch (c) {
    case Convention::kKeys: return "keys";
    case Convention::kLeft: return "left";
    case Convention::kOffByOne: return "off-by-one";
  }
  return "?";
}

std::string_view rope_style_name(RopeStyle s) noexcept {
  switch (s) {
    case RopeStyle::kNone: return "none";
    case RopeStyle::kNeox: return "neox";
    case RopeStyle::kInterleaved: return "interleaved";
  }
  return "?";
}

std::string_view order_name(Order o) noexcept {
  switch (o) {
    case Order::kLoadThenStore: return "load_then_store";
    case Order::kStoreThenLoad: return "store_then_load";
  }
  return "?";
}

}  // namespace kvcheck::scenarios
