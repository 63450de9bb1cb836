#include "pipelines/catalog.hpp"

#include "impl/kv_cache.hpp"
#include "model/spec_report.hpp"
#include "model/trace.hpp"

namespace kvcheck::pipelines {

bool is_fault_name(const std::string& name) {
  impl::Fault fault = impl::Fault::kNone;
  return impl::parse_fault(name, &fault);
}

bool backend_available(const std::string& name, std::string* why) {
  return impl::make_backend(name, why) != nullptr;
}

std::string fault_table() {
  std::string out;
  for (int f = 1; f < impl::kFaultCount; ++f) {
    const auto fault = static_cast<impl::Fault>(f);
    // As printf("%-26s %s\n"): the name left-aligned in 26 columns.
    std::string name(impl::fault_name(fault));
    if (name.size() < 26) name.resize(26, ' ');
    out += name + " " + std::string(impl::fault_description(fault)) + "\n";
  }
  return out;
}

std::string spec_table(bool* all_match) {
  const auto lines = model::reproduce_spec();
  *all_match = true;
  for (const auto& l : lines) *all_match = *all_match && l.match;
  return model::spec_table(lines);
}

std::vector<reports::TraceLine> ring_trace_lines(std::int64_t window_keys, std::int64_t ring_rows,
                                                 std::int64_t state,
                                                 const std::vector<std::int64_t>& positions) {
  std::vector<reports::TraceLine> lines;
  for (const auto& r : model::ring_trace(window_keys, ring_rows, state, positions)) {
    lines.push_back(
        {r.position, r.logical_first, r.logical_last, r.first_read_slot, r.last_read_slot, r.write_slot});
  }
  return lines;
}

}  // namespace kvcheck::pipelines
