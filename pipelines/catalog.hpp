// What the CLI names and lists that lives in model/ and impl/: the named
// faults, which backends this build and machine can run, the docs/semantics.md "Golden values" table,
// and the ring-trace rows of `kvcheck trace`. cli/ asks here, so it includes
// neither model/ nor impl/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reports/trace_table.hpp"

namespace kvcheck::pipelines {

/// Whether `name` names a fault ("none" included).
bool is_fault_name(const std::string& name);

/// Whether the backend `name` ("cpu", "cuda") can run here; when not,
/// `*why` says why (no device, not built, unknown name).
bool backend_available(const std::string& name, std::string* why);

/// Every named fault but `none`, one line each: the name padded to 26
/// columns, then its description (`kvcheck faults`).
std::string fault_table();

/// docs/semantics.md "Golden values" reproduced by the reference model, as a table; `*all_match`
/// says whether every line matched.
std::string spec_table(bool* all_match);

/// The ring-addressing rows of `kvcheck trace`: for each position, its
/// window, the slots it reads and the slot it writes.
std::vector<reports::TraceLine> ring_trace_lines(std::int64_t window_keys, std::int64_t ring_rows,
                                                 std::int64_t state,
                                                 const std::vector<std::int64_t>& positions);

}  // namespace kvcheck::pipelines
