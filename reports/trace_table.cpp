#include "reports/trace_table.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace kvcheck::reports {

std::string trace_text(std::int64_t window, std::int64_t ring, std::int64_t state,
                       const std::vector<TraceLine>& lines) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "W = %lld, S = %lld, state %lld owns slots %lld..%lld\n",
                static_cast<long long>(window), static_cast<long long>(ring), static_cast<long long>(state),
                static_cast<long long>(state * ring), static_cast<long long>(state * ring + ring - 1));
  out += buf;
  std::snprintf(buf, sizeof buf, "%10s | %-15s | %-21s | %s\n", "position", "logical range",
                "first/last read slot", "write slot");
  out += buf;
  for (const TraceLine& r : lines) {
    const std::string range = std::to_string(r.logical_first) + ".." + std::to_string(r.logical_last);
    const std::string reads = std::to_string(r.first_read_slot) + " / " + std::to_string(r.last_read_slot);
    std::snprintf(buf, sizeof buf, "%10lld | %-15s | %-21s | %lld\n", static_cast<long long>(r.position),
                  range.c_str(), reads.c_str(), static_cast<long long>(r.write_slot));
    out += buf;
  }
  return out;
}

std::string trace_json(const std::vector<TraceLine>& lines) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const TraceLine& r : lines) {
    out.push_back({{"position", r.position},
                   {"logical_first", r.logical_first},
                   {"logical_last", r.logical_last},
                   {"first_read_slot", r.first_read_slot},
                   {"last_read_slot", r.last_read_slot},
                   {"write_slot", r.write_slot}});
  }
  return out.dump(2) + "\n";
}

}  // namespace kvcheck::reports
