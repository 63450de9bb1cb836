// Byte accounting of the golden values: separate K/V payloads and rows of a
// given size (a row's own bytes come from the format table,
// support/formats.hpp). Every product is checked.
#pragma once

#include <cstdint>
#include <optional>

namespace kvcheck::model {

/// 2 * layers * kv_heads * width * rows * element_bytes, or nullopt on overflow.
std::optional<std::int64_t> kv_payload_bytes(std::int64_t layers, std::int64_t kv_heads, std::int64_t width,
                                             std::int64_t rows, std::int64_t element_bytes);

// One stored row's bytes (the shared fp8 row: 512 elements -> 528):
// format_row_bytes in support/formats.hpp.

/// rows * bytes_per_row, or nullopt on overflow.
std::optional<std::int64_t> rows_bytes(std::int64_t rows, std::int64_t bytes_per_row);

}  // namespace kvcheck::model
