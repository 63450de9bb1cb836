// Byte accounting of SPEC §6: separate K/V payloads and the shared fp8 row
// with one ue8m0 scale byte per 32 elements. Every product is checked.
#pragma once

#include <cstdint>
#include <optional>

namespace kvcheck::model {

/// 2 * layers * kv_heads * width * rows * element_bytes, or nullopt on overflow.
std::optional<std::int64_t> kv_payload_bytes(std::int64_t layers, std::int64_t kv_heads, std::int64_t width,
                                             std::int64_t rows, std::int64_t element_bytes);

/// One shared row of `elements` one-byte values with one scale byte per
/// `block` elements (rounded up): 512 elements, block 32 -> 528.
std::int64_t shared_row_bytes(std::int64_t elements, std::int64_t block);

/// rows * bytes_per_row, or nullopt on overflow.
std::optional<std::int64_t> rows_bytes(std::int64_t rows, std::int64_t bytes_per_row);

}  // namespace kvcheck::model
