#include "model/bytes.hpp"

#include "support/assert.hpp"

namespace kvcheck::model {

namespace {
std::optional<std::int64_t> checked_mul(std::optional<std::int64_t> a, std::int64_t b) {
  std::int64_t out = 0;
  if (!a || __builtin_mul_overflow(*a, b, &out)) return std::nullopt;
  return out;
}
}  // namespace

std::optional<std::int64_t> kv_payload_bytes(std::int64_t layers, std::int64_t kv_heads, std::int64_t width,
                                             std::int64_t rows, std::int64_t element_bytes) {
  std::optional<std::int64_t> bytes = 2;
  for (const std::int64_t factor : {layers, kv_heads, width, rows, element_bytes}) {
    if (factor < 0) return std::nullopt;
    bytes = checked_mul(bytes, factor);
  }
  return bytes;
}

std::optional<std::int64_t> rows_bytes(std::int64_t rows, std::int64_t bytes_per_row) {
  if (rows < 0 || bytes_per_row < 0) return std::nullopt;
  return checked_mul(rows, bytes_per_row);
}

}  // namespace kvcheck::model
