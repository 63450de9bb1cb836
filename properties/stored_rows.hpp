// Judges the rows a cache stored (StepAnswer::stored_*) against the model's
// reference encoding (model/encoding.hpp). A row the cache stored without
// rounding freedom (values, keys without RoPE, the unrotated dimensions) must
// equal the reference bit for bit: its bytes when the cache reports them,
// else its decoded values exactly. A rotated key element may carry the RoPE
// deviation `dev` the tolerance allows (model/error_bounds.hpp): it must be
// the encoding of some value within dev of the exact element, i.e. lie
// between the encodings of x - dev and x + dev (rounding is monotone), and
// an fp8 block's scale may be any the block maximum within those limits
// selects.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/encoding.hpp"
#include "support/formats.hpp"

namespace kvcheck::properties {

/// Text of a double with all its digits (for mismatch messages).
std::string exact_text(double x);

/// Empty when `stored_values` (and `stored_bytes`, when not null) is a
/// correct encoding of `exact` within the per-element deviations `dev`
/// (all zero: bit for bit against `reference`); else one line naming the
/// first element or scale byte that is not.
template <class R>
std::string check_stored_row(model::Encoding f, const std::vector<R>& exact, const std::vector<double>& dev,
                             const model::EncodedRow& reference, const double* stored_values,
                             const std::uint8_t* stored_bytes) {
  const auto n = static_cast<std::int64_t>(exact.size());
  bool exact_only = true;
  for (double d : dev) exact_only = exact_only && d == 0;
  const std::string label(format_name(f));
  if (exact_only && stored_bytes != nullptr) {
    for (std::size_t b = 0; b < reference.bytes.size(); ++b) {
      if (stored_bytes[b] == reference.bytes[b]) continue;
      // The row's element codes, then (a block-scaled format) its scale bytes.
      const std::int64_t bytes_per = format_element_bytes(f);
      if (static_cast<std::int64_t>(b) >= n * bytes_per) {
        const std::int64_t block = static_cast<std::int64_t>(b) - n * bytes_per;
        return label + " scale byte of block " + std::to_string(block) + " is " +
               std::to_string(stored_bytes[b]) + ", the reference encoding has " +
               std::to_string(reference.bytes[b]);
      }
      const std::int64_t e = static_cast<std::int64_t>(b) / bytes_per;
      return "element " + std::to_string(e) + " of " +
             exact_text(model::to_double(exact[static_cast<std::size_t>(e)])) + " is stored as " +
             exact_text(stored_values[e]) + ", its " + label + " encoding is " +
             exact_text(reference.values[static_cast<std::size_t>(e)]) + " (bytes differ)";
    }
    return {};
  }
  auto element_fits = [&](std::int64_t e, int k) {
    const auto i = static_cast<std::size_t>(e);
    const double lo = model::encode_value(f, R(exact[i] - R(dev[i])), k);
    const double hi = model::encode_value(f, R(exact[i] + R(dev[i])), k);
    return lo <= stored_values[e] && stored_values[e] <= hi;
  };
  auto mismatch = [&](std::int64_t e) {
    const auto i = static_cast<std::size_t>(e);
    return "element " + std::to_string(e) + " of " + exact_text(model::to_double(exact[i])) +
           " is stored as " + exact_text(stored_values[e]) + ", its " + label + " encoding is " +
           exact_text(reference.values[i]) +
           (dev[i] > 0 ? " (RoPE allowance " + exact_text(dev[i]) + ")" : "");
  };
  if (f != model::Encoding::kFp8) {
    for (std::int64_t e = 0; e < n; ++e) {
      if (!element_fits(e, 0)) return mismatch(e);
    }
    return {};
  }
  for (std::int64_t b0 = 0; b0 < n; b0 += model::kFp8ScaleBlock) {
    const std::int64_t b1 = std::min(n, b0 + model::kFp8ScaleBlock);
    R amax_lo = 0, amax_hi = 0;
    for (std::int64_t e = b0; e < b1; ++e) {
      const auto i = static_cast<std::size_t>(e);
      const R a = exact[i] < 0 ? R(-exact[i]) : exact[i];
      const R lo = a - R(dev[i]), hi = a + R(dev[i]);
      if (lo > amax_lo) amax_lo = lo;
      if (hi > amax_hi) amax_hi = hi;
    }
    // A block that may be all zero may take any smaller scale (k of 0 is 0 by convention).
    const int k_lo = amax_lo > 0 ? model::fp8_scale_exponent(amax_lo) : -127;
    const int k_hi = model::fp8_scale_exponent(amax_hi);
    const std::int64_t block = b0 / model::kFp8ScaleBlock;
    int first_k = k_lo, last_k = k_hi;
    if (stored_bytes != nullptr) {
      const int k = static_cast<int>(stored_bytes[n + block]) - 127;
      // A zero block (k = 0) is allowed only when the block may be all zero.
      const bool allowed = (k >= k_lo && k <= k_hi) || (k == 0 && !(amax_lo > 0));
      if (!allowed) {
        return "fp8 scale byte of block " + std::to_string(block) + " is " + std::to_string(k + 127) +
               ", the reference encoding allows " + std::to_string(k_lo + 127) +
               (k_hi != k_lo ? ".." + std::to_string(k_hi + 127) : "");
      }
      first_k = last_k = k;
    }
    std::int64_t worst = -1;
    bool fits = false;
    for (int k = first_k; k <= last_k && !fits; ++k) {
      fits = true;
      for (std::int64_t e = b0; e < b1 && fits; ++e) {
        if (!element_fits(e, k)) {
          fits = false;
          if (worst < 0) worst = e;
        }
      }
    }
    if (!fits) return mismatch(worst);
  }
  return {};
}

}  // namespace kvcheck::properties
