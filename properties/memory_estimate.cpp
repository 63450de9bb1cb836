#include "properties/memory_estimate.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <string>

#include "scenarios/step_semantics.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"

namespace kvcheck::properties {

namespace {

// Bytes per unit, measured with /usr/bin/time on replays of scenarios that
// grow one dimension at a time (README "Memory"), rounded up.
constexpr double kProcessBytes = 16.0 * 1024 * 1024;  // the executable, MPFR, the report
constexpr double kSlotTagBytes = 32;                  // a slot's tag (24) and write stamp (8)
constexpr double kLayerBytes = 32.0 * 1024;           // one layer's fixed buffers and bookkeeping
constexpr double kRowBytes = 512;                     // one written row's fixed bookkeeping
constexpr double kRowKvElementBytes = 256;  // per key/value element: exact and dequantized, key and value
constexpr double kRowQElementBytes = 96;    // per query element of the row
constexpr double kQueryBytes = 1024;        // one query's observation
constexpr double kReadBytes = 128;          // one recorded read (replay keeps every read)
constexpr double kWireElementBytes = 32;    // one element of a row or answer as JSON text, and parsed
constexpr double kTraceReadBytes = 8;       // one slot of a trace's block table, expanded
constexpr double kSweepRowBytes = 256;      // one configuration's result row of a sweep
constexpr double kSweepProbeRowBytes = 64;  // one row of a sweep probe's tag buffers
// Mean reads per case of `kvcheck check` (measured: 243, 14284, 344 at the
// features generator): the default profile (and trim,
// layers, prefix, drawn from it), production, paged (estimate_check_reads).
constexpr double kCheckReadsPerCase[] = {300, 24000, 400};

/// The reference's reals are larger or smaller than at 113 bits.
double precision_factor(int bits) {
  return bits <= 53 ? 0.4 : (bits > 113 ? 1.3 : 1.0);
}

/// Sum of min(p + 1, keys) over p in [first, first + n): the rows the
/// queries of one step see.
double visible_sum(double first, double n, double keys) {
  if (n <= 0) return 0;
  const double last = first + n - 1;
  double sum = 0;
  // Positions whose window is not yet full: p + 1 < keys.
  const double growing_last = std::min(last, keys - 2);
  if (growing_last >= first) sum += (first + 1 + growing_last + 1) * (growing_last - first + 1) / 2;
  const double full_first = std::max(first, keys - 1);
  if (last >= full_first) sum += keys * (last - full_first + 1);
  return sum;
}

/// Terms of one estimate: transient (freed after the run) and kept (the report's).
struct Terms {
  double pool = 0, layers = 0, rows = 0, observations = 0;
  std::string pool_field, layer_field, rows_field = "steps", observations_field = "cache.window";
  std::string pool_formula = "the cache pool, layers*states*ring_rows*(slot bytes + 32)";
  std::string layer_formula =
      "per-layer buffers, layers*(32 KiB + (window + longest step)*(slot bytes + 32 + 8*q_heads))";
};

/// Keys the widest layer's queries see: the cache's window, or the widest
/// of its layer windows (a global layer's: every position, which the
/// visible-row sums cap at each query's position).
double widest_keys(const scenarios::CacheConfig& c) {
  std::int64_t keys = window_keys(c);
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(c.layer_windows.size()); ++l)
    keys = std::max(keys, scenarios::layer_window_keys(c, l));
  return static_cast<double>(keys);
}

Terms run_terms(const scenarios::Scenario& sc, const RunOptions& options) {
  const auto& c = sc.cache;
  const double layers = c.layers;
  // Reads: the widest layer's window. Scratch: a pool's window is capped at
  // its ring and a step's rows (engines/ring_pool_cache.cpp).
  const double read_keys = widest_keys(c);
  std::int64_t most_rows = 1;
  for (const auto& s : sc.steps) most_rows = std::max(most_rows, scenarios::step_rows(s));
  const double max_step = static_cast<double>(most_rows);  // the longest step's rows
  const double keys =
      c.layer_windows.empty() ? read_keys : std::min(read_keys, static_cast<double>(c.ring_rows + most_rows));
  const double kv_width = static_cast<double>(c.kv_heads) * c.head_dim;
  const double q_width = static_cast<double>(c.q_heads) * c.head_dim;
  const double row = static_cast<double>(format_row_bytes(c.format, std::int64_t{c.kv_heads} * c.head_dim));
  const double slot = c.shared_row ? row : 2 * row;
  const double stride = std::fmod(slot, 4096) == 0 ? slot + 64 : slot;

  double written = 0, visible = 0;
  // A shared prefix's rows are not written: its requests start at its length.
  std::map<std::int64_t, scenarios::RequestProgress> progress = scenarios::start_progress(sc.requests);
  for (const auto& s : sc.steps) {
    scenarios::RequestProgress& p = progress[s.request];
    const double n = static_cast<double>(scenarios::step_rows(s));
    written += n;
    visible += visible_sum(static_cast<double>(scenarios::step_first_position(p)), n, read_keys);
    scenarios::advance(p, s);
  }

  Terms t;
  if (!backend_owns_pool(options.backend)) {
    // An exec adapter or a trace holds the cache's slots itself: kvcheck
    // allocates no pool and no slot-sized scratch for it, only each step's
    // rows and answers (JSON text for exec, the record's rows for a trace).
    t.pool = 0;
    t.pool_field = "cache.ring_rows";
    t.layers = layers * (kLayerBytes + max_step * (2 * kv_width + 2 * q_width) * kWireElementBytes);
    t.layer_field = q_width > kv_width ? "cache.q_heads" : "cache.head_dim";
    if (max_step > kv_width + q_width) t.layer_field = "steps";
    t.layer_formula =
        "each step's rows and answers, layers*longest step*(2*kv_heads + 2*q_heads)*head_dim*32 bytes";
  } else {
    t.pool =
        layers * static_cast<double>(c.states) * static_cast<double>(c.ring_rows) * (stride + kSlotTagBytes);
    // The pool grows with whichever of its factors is largest.
    t.pool_field = "cache.ring_rows";
    if (static_cast<double>(c.states) > static_cast<double>(c.ring_rows) && c.states >= c.layers)
      t.pool_field = "cache.states";
    if (layers > static_cast<double>(c.ring_rows) && c.layers > c.states) t.pool_field = "cache.layers";
    // Per layer: fixed buffers, plus scratch and scores over window + chunk rows.
    const double scratch_rows = keys + max_step;
    t.layers =
        layers * (kLayerBytes + scratch_rows * (stride + kSlotTagBytes + 8 * c.q_heads) + max_step * slot);
    t.layer_field = layers >= scratch_rows ? "cache.layers" : "cache.window";
  }
  const double factor = precision_factor(options.precision_bits);
  t.rows =
      layers * written * (kRowBytes + factor * (kRowKvElementBytes * kv_width + kRowQElementBytes * q_width));
  t.observations = layers * (written * kQueryBytes + (options.record_reads ? visible * kReadBytes : 0));
  // Rows and observations are per layer too: name layers when they are the larger factor.
  if (layers > written) t.rows_field = "cache.layers";
  // A row's width can outgrow the step count: name the head count or size that makes it wide.
  const double row_width =
      std::max(kRowQElementBytes * q_width, kRowKvElementBytes * kv_width) / kRowKvElementBytes;
  if (row_width > std::max(written, layers)) {
    t.rows_field = kRowQElementBytes * q_width > kRowKvElementBytes * kv_width && c.q_heads > c.head_dim
                       ? "cache.q_heads"
                       : "cache.head_dim";
  }
  if (layers > (options.record_reads ? keys : written))
    t.observations_field = "cache.layers";
  else if (!options.record_reads)
    t.observations_field = "steps";
  return t;
}

/// The estimate from its terms, naming the largest one.
MemoryEstimate from_terms(const Terms& t, double transient_extra = 0) {
  MemoryEstimate e;
  e.bytes = kProcessBytes + t.pool + t.layers + t.rows + t.observations + transient_extra;
  const struct {
    double bytes;
    std::string field, formula;
  } terms[] = {
      {t.pool, t.pool_field, t.pool_formula},
      {t.layers, t.layer_field, t.layer_formula},
      {t.rows, t.rows_field,
       "the reference's rows, rows written*layers*(512 + 256*kv_heads*head_dim + 96*q_heads*head_dim)"},
      {t.observations, t.observations_field,
       "observations kept for the report, queries*layers*1 KiB + reads*layers*128"},
  };
  for (const auto& term : terms) {
    if (term.bytes > e.driver_bytes) {
      e.driver_bytes = term.bytes;
      e.driver = term.field;
      e.driver_formula = term.formula;
    }
  }
  return e;
}

std::int64_t read_number(const char* path, const char* key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (key[0] == '\0' || line.rfind(key, 0) == 0) {
      const std::string rest = line.substr(std::string(key).size());
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(rest.c_str(), &end, 10);
      if (end == rest.c_str() || errno == ERANGE) return -1;
      return v;
    }
  }
  return -1;
}

}  // namespace

bool backend_owns_pool(const std::string& backend) {
  return backend == "cpu" || backend == "cuda" || backend == "paged" || backend == "layer";
}

MemoryEstimate estimate_run(const scenarios::Scenario& scenario, const RunOptions& options) {
  return from_terms(run_terms(scenario, options));
}

MemoryEstimate estimate_replay(const std::vector<scenarios::Scenario>& scenarios, const RunOptions& options) {
  // Observations of every run stay for the report; the rest is freed between runs.
  Terms largest, kept;
  double largest_transient = -1;
  for (const auto& sc : scenarios) {
    const Terms t = run_terms(sc, options);
    kept.observations += t.observations;
    const double transient = t.pool + t.layers + t.rows;
    if (transient > largest_transient) {
      largest_transient = transient;
      largest = t;
    }
  }
  largest.observations = kept.observations;
  return from_terms(largest);
}

MemoryEstimate estimate_audit(const std::vector<scenarios::Scenario>& scenarios,
                              const std::vector<scenarios::TraceRun>& runs, const RunOptions& options) {
  MemoryEstimate e = estimate_replay(scenarios, options);
  // The recorded reads on top: each expanded from its block table while judged.
  const WorkEstimate work = estimate_audit_work(scenarios, runs);
  const double recorded = work.recorded_reads * (kTraceReadBytes + kReadBytes);
  e.bytes += recorded;
  if (recorded > e.driver_bytes) {
    e.driver_bytes = recorded;
    e.driver = work.recorded_driver;
    e.driver_formula = "the recorded reads (block tables expanded), reads*136 bytes";
  }
  return e;
}

MemoryEstimate estimate_sweep(const SweepSize& size) {
  // Each configuration keeps one result row; each worker holds one probe's
  // buffers over window + the longest step (k + 1 drafts or one chunk).
  MemoryEstimate e;
  const double rows = size.configurations * kSweepRowBytes;
  const double probe = std::max(1, size.threads) * size.states *
                       (size.max_window + std::max(size.max_drafts + 1, size.max_chunk)) *
                       kSweepProbeRowBytes;
  e.bytes = kProcessBytes + rows + probe;
  if (rows >= probe) {
    e.driver_bytes = rows;
    e.driver = size.widest_flag;
    e.driver_formula = "one result row per configuration, windows*drafts*chunks*orders*256 bytes";
  } else {
    e.driver_bytes = probe;
    e.driver = size.max_window >= size.max_chunk ? "--window" : "--chunk";
    e.driver_formula = "each worker's probe, threads*states*(window + longest step)*64 bytes";
  }
  return e;
}

namespace {

/// The step of `sc` whose queries read the most rows, and every step's reads.
struct StepReads {
  double total = 0, largest = 0;
  std::size_t largest_step = 0;
};

StepReads step_reads(const scenarios::Scenario& sc) {
  const double keys = widest_keys(sc.cache);
  StepReads r;
  std::map<std::int64_t, scenarios::RequestProgress> progress = scenarios::start_progress(sc.requests);
  for (std::size_t i = 0; i < sc.steps.size(); ++i) {
    const auto& s = sc.steps[i];
    scenarios::RequestProgress& p = progress[s.request];
    const double n = static_cast<double>(scenarios::step_rows(s));
    // One layer's reads: layers repeat the same work, linear in their count
    // (and charged by the memory estimate); a step's visible rows are not.
    const double reads = visible_sum(static_cast<double>(scenarios::step_first_position(p)), n, keys);
    r.total += reads;
    if (reads > r.largest) {
      r.largest = reads;
      r.largest_step = i;
    }
    scenarios::advance(p, s);
  }
  return r;
}

}  // namespace

WorkEstimate estimate_replay_work(const std::vector<scenarios::Scenario>& scenarios) {
  WorkEstimate w;
  double largest = -1;
  for (const auto& sc : scenarios) {
    const StepReads r = step_reads(sc);
    w.reads += r.total;
    w.all_layer_reads += r.total * static_cast<double>(std::max(sc.cache.layers, 1));
    if (r.largest > largest) {
      largest = r.largest;
      w.driver = "steps[" + std::to_string(r.largest_step) + "].rows";
      w.driver_scenario = sc.name;
    }
  }
  return w;
}

WorkEstimate estimate_audit_work(const std::vector<scenarios::Scenario>& scenarios,
                                 const std::vector<scenarios::TraceRun>& runs) {
  WorkEstimate w = estimate_replay_work(scenarios);
  double largest = -1;
  for (const auto& run : runs) {
    const double keys = static_cast<double>(scenarios::trace_window_keys(run.header));
    for (const auto& s : run.steps) {
      double reads = 0;
      for (const auto& list : s.read) reads += static_cast<double>(list.size());
      for (const std::int64_t len : s.block_table.seq_lens)
        reads += std::min(static_cast<double>(std::max<std::int64_t>(len, 0)), keys);
      w.recorded_reads += reads;
      if (s.layer != 0) continue;  // the work bound counts one layer, as for a scenario
      w.layer0_recorded_reads += reads;
      if (reads > largest) {
        largest = reads;
        w.recorded_driver = "line " + std::to_string(s.line) + ": " +
                            (s.block_table.seq_lens.empty() ? "read" : "block_table.seq_lens");
        w.recorded_source = run.source;
      }
    }
  }
  if (w.layer0_recorded_reads > w.reads) {
    w.driver = w.recorded_driver;
    w.driver_scenario = w.recorded_source;
  }
  w.reads = std::max(w.reads, w.layer0_recorded_reads);
  return w;
}

namespace {

std::string count_text(double n) {
  char text[64];
  std::snprintf(text, sizeof text, "%.3g", n);
  return text;
}

/// `n` in rows, or a whole number with K, M, G or T (powers of 1024).
std::int64_t parse_scaled(const std::string& flag, const std::string& text, const char* what) {
  const auto fail = [&] {
    throw Error(ErrorId::kUsage, flag,
                std::string("expects ") + what +
                    ", or a whole number with K, M, G or T (powers of 1024), got '" + text + "'");
  };
  if (text.empty()) fail();
  std::string digits = text;
  int shift = 0;
  switch (text.back()) {
    case 'K':
    case 'k': shift = 10; break;
    case 'M':
    case 'm': shift = 20; break;
    case 'G':
    case 'g': shift = 30; break;
    case 'T':
    case 't': shift = 40; break;
    default: break;
  }
  if (shift > 0) digits.pop_back();
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) fail();
  errno = 0;
  const unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno == ERANGE || v == 0 || v > (std::numeric_limits<std::uint64_t>::max() >> (shift + 1))) fail();
  return static_cast<std::int64_t>(v << shift);
}

}  // namespace

void require_work(const WorkEstimate& work, const std::string& what, std::optional<std::int64_t> limit) {
  if (!limit || work.reads <= static_cast<double>(*limit)) return;
  throw Error(ErrorId::kSize, work.driver,
              what + " would read " + count_text(work.reads) +
                  " rows (every query's visible rows in one layer, all runs), more than --work-limit " +
                  std::to_string(*limit) +
                  (work.driver_scenario.empty() ? "" : "; the largest step is in " + work.driver_scenario));
}

double sweep_probe_rows(const SweepSize& size) {
  return size.configurations * (size.max_window + std::max(size.max_drafts + 1, size.max_chunk)) *
         kSweepProbesPerConfiguration;
}

void require_sweep_work(const SweepSize& size, std::optional<std::int64_t> limit) {
  const double rows = sweep_probe_rows(size);
  if (!limit || rows <= static_cast<double>(*limit)) return;
  throw Error(ErrorId::kSize, size.widest_flag,
              "the sweep's " + count_text(size.configurations) + " configurations would simulate up to " +
                  count_text(rows) + " probe rows (configurations * (window + longest step) * " +
                  std::to_string(static_cast<int>(kSweepProbesPerConfiguration)) +
                  " probes), more than --work-limit " + std::to_string(*limit) +
                  "; narrow the grid or split it with --shard");
}

double estimate_check_reads(Profile profile, std::int64_t cases) {
  // Mean reads (one layer's queries' visible rows) per case over case seeds
  // 0..999 of each profile on the CPU cache, rounded up: tests/properties/
  // memory_estimate_test.cpp recomputes them and fails when a profile's
  // cases outgrow its figure.
  double per_case = 0;
  switch (profile) {
    case Profile::kProduction: per_case = kCheckReadsPerCase[1]; break;
    case Profile::kPaged: per_case = kCheckReadsPerCase[2]; break;
    default: per_case = kCheckReadsPerCase[0]; break;
  }
  return per_case * static_cast<double>(std::max<std::int64_t>(cases, 0));
}

void require_check_work(Profile profile, std::int64_t cases, std::optional<std::int64_t> limit) {
  const double reads = estimate_check_reads(profile, cases);
  if (!limit || reads <= static_cast<double>(*limit)) return;
  throw Error(ErrorId::kSize, "--cases",
              "the check's " + std::to_string(cases) + " cases would read about " + count_text(reads) +
                  " rows (the profile's mean reads per case times the cases), more than --work-limit " +
                  std::to_string(*limit));
}

std::int64_t parse_work_limit(const std::string& flag, const std::string& text) {
  return parse_scaled(flag, text, "rows");
}

std::string work_text(double reads, const MemoryEstimate& memory) {
  return count_text(reads) + " reads, estimated peak memory " + bytes_text(memory.bytes);
}

MemoryEstimate estimate_check(Profile profile, int threads) {
  // A worker holds one case at a time (tallies stream, no per-case results).
  // Production cases are bounded by the generator's budget; default cases
  // are at most 3 states of 2*keys+2 rows of 2x2x8 doubles.
  double per_case = 8.0 * 1024 * 1024;
  if (profile == Profile::kProduction) {
    const ProductionBudget b = production_budget();
    const double elements = static_cast<double>(b.row_elements);
    // The pool with its tags (a slot of the narrowest rows is at least 128
    // bytes against 32 of tag), the rows (query rows up to 8x the key rows).
    per_case = 1.25 * static_cast<double>(b.pool_bytes) +
               elements * (kRowKvElementBytes + 8 * kRowQElementBytes) +
               elements / 64 * (kRowBytes + kQueryBytes);
  }
  Terms t;
  t.pool = per_case * std::max(1, threads);
  t.pool_field = "--threads";
  t.pool_formula = "--threads workers, each at the largest case of the profile";
  return from_terms(t);
}

std::int64_t available_memory_bytes(std::string* source) {
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  std::string from = "no limit known";
  const std::int64_t avail_kb = read_number("/proc/meminfo", "MemAvailable:");
  if (avail_kb >= 0) {
    best = avail_kb * 1024;
    from = "MemAvailable in /proc/meminfo";
  }
  // cgroup v2: memory.max is "max" (no limit) or bytes.
  const std::int64_t max = read_number("/sys/fs/cgroup/memory.max", "");
  const std::int64_t used = read_number("/sys/fs/cgroup/memory.current", "");
  if (max > 0 && used >= 0 && max - used < best) {
    best = std::max<std::int64_t>(0, max - used);
    from = "the cgroup's memory.max less memory.current";
  }
  // An address-space limit (ulimit -v) less what this process has mapped:
  // past it an allocation fails however much memory the machine has free.
  struct rlimit as {};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const std::int64_t pages = read_number("/proc/self/statm", "");
    const std::int64_t mapped = pages > 0 ? pages * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE)) : 0;
    const auto cap = static_cast<std::int64_t>(std::min<rlim_t>(as.rlim_cur, INT64_MAX));
    if (cap - mapped < best) {
      best = std::max<std::int64_t>(0, cap - mapped);
      from = "the address-space limit (ulimit -v) less what kvcheck has mapped";
    }
  }
  if (source) *source = from;
  return best;
}

std::int64_t parse_memory_limit(const std::string& flag, const std::string& text) {
  return parse_scaled(flag, text, "bytes");
}

std::string bytes_text(double bytes) {
  char text[64];
  if (bytes >= 1e9)
    std::snprintf(text, sizeof text, "%.1f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(text, sizeof text, "%.1f MB", bytes / 1e6);
  else
    std::snprintf(text, sizeof text, "%.1f kB", bytes / 1e3);
  return text;
}

void require_memory(const MemoryEstimate& estimate, std::int64_t limit_bytes,
                    const std::string& limit_source) {
  if (estimate.bytes <= static_cast<double>(limit_bytes)) return;
  throw Error(ErrorId::kMemory, estimate.driver,
              "the run needs an estimated " + bytes_text(estimate.bytes) + " (" +
                  bytes_text(estimate.driver_bytes) + " of it " + estimate.driver_formula +
                  "), more than the " + bytes_text(static_cast<double>(limit_bytes)) + " allowed (" +
                  limit_source + ")");
}

}  // namespace kvcheck::properties
