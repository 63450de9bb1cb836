#include "cli/sweep_flags.hpp"

#include <algorithm>

#include "support/error.hpp"

namespace kvcheck::cli {

using sweep::SweepOrder;

std::vector<std::int64_t> parse_value_list(const std::string& flag, const std::string& text, std::int64_t lo,
                                           std::int64_t hi) {
  auto number = [&](const std::string& item, const std::string& part) -> std::int64_t {
    if (part.empty() || part.size() > 18 ||
        !std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      throw Error(ErrorId::kUsage, flag,
                  "expects A, A:B or A:B:STEP with non-negative integers, got '" + item + "'");
    }
    return std::stoll(part);
  };
  if (text.empty()) throw Error(ErrorId::kUsage, flag, "expects A, A:B or A:B:STEP, got an empty value");
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::vector<std::string> parts;
    std::size_t p = 0;
    while (true) {
      const std::size_t colon = item.find(':', p);
      parts.push_back(item.substr(p, colon == std::string::npos ? std::string::npos : colon - p));
      if (colon == std::string::npos) break;
      p = colon + 1;
    }
    if (parts.size() > 3) {
      throw Error(ErrorId::kUsage, flag, "expects A, A:B or A:B:STEP, got '" + item + "'");
    }
    const std::int64_t a = number(item, parts[0]);
    const std::int64_t b = parts.size() > 1 ? number(item, parts[1]) : a;
    const std::int64_t step = parts.size() > 2 ? number(item, parts[2]) : 1;
    if (a > b) {
      throw Error(ErrorId::kUsage, flag,
                  "range '" + item + "' is empty: " + std::to_string(a) + " > " + std::to_string(b));
    }
    if (step == 0) throw Error(ErrorId::kUsage, flag, "range '" + item + "' has step 0");
    if (a < lo || b > hi) {
      throw Error(
          ErrorId::kUsage, flag,
          "values must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" + item + "'");
    }
    if ((b - a) / step >= 1'000'000)
      throw Error(ErrorId::kUsage, flag, "range '" + item + "' has too many values");
    for (std::int64_t v = a; v <= b; v += step) out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<SweepOrder> parse_orders(const std::string& flag, const std::string& text) {
  std::string t = text;
  std::replace(t.begin(), t.end(), '_', '-');
  if (t == "store-then-load") return {SweepOrder::kStoreThenLoad};
  if (t == "load-then-store") return {SweepOrder::kLoadThenStore};
  if (t == "both") return {SweepOrder::kStoreThenLoad, SweepOrder::kLoadThenStore};
  throw Error(ErrorId::kUsage, flag, "expects store-then-load, load-then-store or both, got '" + text + "'");
}

}  // namespace kvcheck::cli
