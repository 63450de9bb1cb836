// The sweep's grid flags (`--window`, `--drafts`, `--chunk`, `--order`):
// value lists and prefill orders read from text. Flag parsing lives in cli/;
// sweep/ receives the grid as numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sweep/sweep.hpp"

namespace kvcheck::cli {

/// Parses a value list: comma-separated items, each `A`, `A:B` or `A:B:STEP`
/// (inclusive, step >= 1), every value in [lo, hi], sorted and deduplicated.
/// Throws kvcheck::Error(kUsage, flag, ...) for A > B, step 0, values out of
/// range or malformed text.
std::vector<std::int64_t> parse_value_list(const std::string& flag, const std::string& text, std::int64_t lo,
                                           std::int64_t hi);
/// Parses `store-then-load`, `load-then-store` or `both` (underscores accepted).
std::vector<sweep::SweepOrder> parse_orders(const std::string& flag, const std::string& text);

}  // namespace kvcheck::cli
