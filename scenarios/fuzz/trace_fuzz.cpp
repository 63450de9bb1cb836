// libFuzzer target for the trace reader (scenarios/trace_json.hpp). Any input
// either parses or throws kvcheck::Error; every other exception, crash or
// sanitizer report is a bug. A parsed trace must also survive the canonical
// round trip: parse(write(t)) == t (line numbers aside) and write is
// byte-stable; and every step's reads must expand (trace_read_slots) without
// an error the parser should have raised.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "scenarios/trace_json.hpp"
#include "support/error.hpp"

namespace {

using namespace kvcheck::scenarios;

/// The trace's records as the writer writes them.
std::string written(const std::vector<TraceRun>& runs) {
  std::string text;
  for (const TraceRun& run : runs) {
    text += trace_header_line(run.header);
    for (const TraceStep& s : run.steps) text += trace_step_line(s);
  }
  return text;
}

/// `runs` without what depends on where the text came from (lines, source).
std::vector<TraceRun> placeless(std::vector<TraceRun> runs) {
  for (TraceRun& run : runs) {
    run.source.clear();
    run.header_line = 0;
    for (TraceStep& s : run.steps) s.line = 0;
  }
  return runs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<TraceRun> runs;
  try {
    runs = parse_trace(text, "fuzz-input");
  } catch (const kvcheck::Error&) {
    return 0;  // rejected input: the expected outcome for most inputs
  }
  // Not caught: a kvcheck::Error here means write produced text parse refuses,
  // or the parser let through a block table it cannot expand.
  for (const TraceRun& run : runs) {
    const std::int64_t keys = trace_window_keys(run.header);
    for (const TraceStep& s : run.steps) {
      // Expanding costs up to kMaxExpandedReads slots (512 MiB); the fuzzer's
      // memory limit is for bugs, so only steps of at most 2^16 reads expand.
      std::int64_t reads = 0;
      for (const std::int64_t len : s.block_table.seq_lens) reads += std::min(len, keys);
      if (reads <= (std::int64_t{1} << 16)) (void)trace_read_slots(s, keys);
    }
  }
  const std::string saved = written(runs);
  const std::vector<TraceRun> again = parse_trace(saved, "fuzz-roundtrip");
  if (!(placeless(again) == placeless(runs))) std::abort();
  if (written(again) != saved) std::abort();
  return 0;
}
