// Host-side encode and decode of one stored row in an element format, shared
// by the CPU backend (store, read_row) and the CUDA backend's host read_row,
// so both read and write bytes with the same element_format.hpp functions.
// Host only: it uses memcpy for unaligned loads and stores.
#pragma once

#include <cstdint>
#include <cstring>

#include "impl/element_format.hpp"
#include "impl/kv_cache.hpp"
#include "support/assert.hpp"

namespace kvcheck::impl {

/// Encodes n finite doubles into one row of format f
/// (format_row_bytes(f, n) bytes at `row`).
inline void encode_row(ElementFormat f, const double* in, std::int64_t n, std::uint8_t* row) {
  switch (f) {
    case ElementFormat::kF64: std::memcpy(row, in, static_cast<std::size_t>(n) * sizeof(double)); return;
    case ElementFormat::kF32:
      for (std::int64_t i = 0; i < n; ++i) {
        const float x = static_cast<float>(in[i]);
        std::memcpy(row + 4 * i, &x, sizeof x);
      }
      return;
    case ElementFormat::kBf16:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t h = bf16_from_double(in[i]);
        std::memcpy(row + 2 * i, &h, sizeof h);
      }
      return;
    case ElementFormat::kFp8: fp8_encode_row(in, n, row); return;
  }
  KVCHECK_ASSERT(false);
}

/// Decodes one row of format f into n doubles (exact: every stored value is
/// representable in double).
inline void decode_row(ElementFormat f, const std::uint8_t* row, std::int64_t n, double* out) {
  switch (f) {
    case ElementFormat::kF64: std::memcpy(out, row, static_cast<std::size_t>(n) * sizeof(double)); return;
    case ElementFormat::kF32:
      for (std::int64_t i = 0; i < n; ++i) {
        float x;
        std::memcpy(&x, row + 4 * i, sizeof x);
        out[i] = x;
      }
      return;
    case ElementFormat::kBf16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, row + 2 * i, sizeof h);
        out[i] = bf16_to_float(h);
      }
      return;
    case ElementFormat::kFp8: fp8_decode_row(row, n, out); return;
  }
  KVCHECK_ASSERT(false);
}

}  // namespace kvcheck::impl
