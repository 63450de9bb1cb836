// Trace JSON Lines I/O: each line parsed by a SAX-built document (duplicate
// keys, depth and non-finite numbers caught with their path), converted
// strictly (types, unknown and missing keys, ranges, sizes against the
// header), then each run's record order checked. See trace_json.hpp.
#include "scenarios/trace_json.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "scenarios/expect_json.hpp"
#include "scenarios/json_read.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

namespace kvcheck::scenarios {
namespace {

using namespace json_read;
using ojson = nlohmann::ordered_json;

/// "line N: PATH", or "line N" for the whole line.
std::string at_line(std::int64_t line, const std::string& path) {
  return "line " + std::to_string(line) + (path.empty() ? "" : ": " + path);
}

// ---- typed reads (the shared ones are in scenarios/json_read.hpp) ----------------

/// An integer in [lo, hi]: below lo is a value error, above hi a size error.
std::int64_t get_range(const json& j, const std::string& path, std::int64_t lo, std::int64_t hi,
                       std::string_view what) {
  const std::int64_t v = get_i64(j, path);
  if (v < lo)
    fail(ErrorId::kJsonValue, path,
         std::string(what) + " " + std::to_string(v) + " is below " + std::to_string(lo));
  if (v > hi)
    fail(ErrorId::kSize, path,
         std::string(what) + " " + std::to_string(v) + " exceeds " + std::to_string(hi));
  return v;
}

constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kSlotMax = std::numeric_limits<std::int64_t>::max();

// The step kinds in table order (scenarios/step_kinds.hpp), then begin.
constexpr TraceKind kKinds[] = {
#define KVCHECK_TRACE_KIND_VALUE(id, name, fields, rows, runs_with, ends, begun) TraceKind::id,
    KVCHECK_STEP_KINDS(KVCHECK_TRACE_KIND_VALUE)
#undef KVCHECK_TRACE_KIND_VALUE
        TraceKind::kBegin};

/// The parameter fields of a record kind (a begin has none).
constexpr StepFields trace_kind_fields(TraceKind k) noexcept {
  return k == TraceKind::kBegin ? StepFields::kNone : step_kind_fields(trace_step_kind(k));
}
constexpr Addressing kAddressings[] = {Addressing::kRing, Addressing::kPaged, Addressing::kOpaque};
constexpr TraceReadView kReadViews[] = {TraceReadView::kAfterWrites, TraceReadView::kCausal};

// ---- header ---------------------------------------------------------------------------

TraceCache read_trace_cache(const json& j, const std::string& path) {
  as_object(j, path);
  check_keys(j, path,
             {"q_heads", "kv_heads", "head_dim", "shared_row", "format", "rope", "softmax_scale",
              "sink_logit", "layers"});
  TraceCache c;
  const auto count32 = [&](std::string_view key, std::int32_t* out) {
    if (const json* v = find(j, key))
      *out = static_cast<std::int32_t>(get_range(*v, join_key(path, key), 1, kI32Max, key));
  };
  count32("q_heads", &c.q_heads);
  count32("kv_heads", &c.kv_heads);
  count32("head_dim", &c.head_dim);
  if (const json* v = find(j, "layers")) {
    c.layers = static_cast<std::int32_t>(get_range(*v, join_key(path, "layers"), 1, kI32Max, "layers"));
  }
  if (const json* v = find(j, "shared_row")) c.shared_row = get_bool(*v, join_key(path, "shared_row"));
  if (const json* v = find(j, "format"))
    c.format = get_enum(*v, join_key(path, "format"), kElementFormats, format_name);
  if (const json* v = find(j, "rope")) {
    const std::string rp = join_key(path, "rope");
    as_object(*v, rp);
    check_keys(*v, rp, {"style", "rotary_dims", "base"});
    if (const json* s = find(*v, "style"))
      c.rope.style = get_enum(*s, join_key(rp, "style"), kRopeStyles, rope_style_name);
    if (const json* d = find(*v, "rotary_dims")) {
      c.rope.rotary_dims =
          static_cast<std::int32_t>(get_range(*d, join_key(rp, "rotary_dims"), 0, kI32Max, "rotary_dims"));
    }
    if (const json* b = find(*v, "base")) {
      c.rope.base = get_f64(*b, join_key(rp, "base"));
      check_real(c.rope.base, join_key(rp, "base"));
      if (!(c.rope.base > 0)) fail(ErrorId::kJsonValue, join_key(rp, "base"), "base must be positive");
    }
  }
  if (const json* v = find(j, "softmax_scale")) {
    c.softmax_scale = get_optional_f64(*v, join_key(path, "softmax_scale"));
    if (c.softmax_scale) {
      check_real(*c.softmax_scale, join_key(path, "softmax_scale"));
      if (!(*c.softmax_scale > 0))
        fail(ErrorId::kJsonValue, join_key(path, "softmax_scale"), "softmax_scale must be positive");
    }
  }
  if (const json* v = find(j, "sink_logit")) {
    c.sink_logit = get_optional_f64(*v, join_key(path, "sink_logit"));
    if (c.sink_logit) check_real(*c.sink_logit, join_key(path, "sink_logit"));
  }
  if (c.q_heads % c.kv_heads != 0) {
    fail(ErrorId::kJsonValue, join_key(path, "q_heads"),
         "q_heads " + std::to_string(c.q_heads) + " is not a multiple of kv_heads " +
             std::to_string(c.kv_heads));
  }
  if (c.shared_row && c.kv_heads != 1) {
    fail(ErrorId::kJsonValue, join_key(path, "shared_row"),
         "a shared key/value row needs kv_heads 1, found " + std::to_string(c.kv_heads));
  }
  const std::int32_t dims = c.rope.rotary_dims;
  if (c.rope.style == RopeStyle::kNone ? dims != 0 : (dims < 2 || dims % 2 != 0 || dims > c.head_dim)) {
    fail(ErrorId::kJsonValue, join_key(path, "rope.rotary_dims"),
         c.rope.style == RopeStyle::kNone
             ? "rotary_dims must be 0 when rope style is 'none', found " + std::to_string(dims)
             : "rotary_dims " + std::to_string(dims) + " must be even, at least 2 and at most head_dim " +
                   std::to_string(c.head_dim));
  }
  return c;
}

/// "resident_bound": {"unit": "rows"|"blocks", "per": "request"|"cache", "limit": N};
/// per defaults to "cache"; blocks need the header's block_size.
TraceResidentBound read_resident_bound(const json& j, const TraceHeader& h, const std::string& path) {
  as_object(j, path);
  check_keys(j, path, {"unit", "per", "limit"});
  TraceResidentBound b;
  const std::string unit = get_string(require(j, path, "unit"), join_key(path, "unit"));
  if (unit != "rows" && unit != "blocks") {
    fail(ErrorId::kJsonValue, join_key(path, "unit"), "unknown name '" + unit + "' (one of 'rows', 'blocks')");
  }
  b.blocks = unit == "blocks";
  if (b.blocks && h.block_size == 0) {
    fail(ErrorId::kJsonValue, join_key(path, "unit"), "a bound in blocks needs a block_size (addressing \"paged\")");
  }
  if (const json* v = find(j, "per")) {
    const std::string per = get_string(*v, join_key(path, "per"));
    if (per != "request" && per != "cache") {
      fail(ErrorId::kJsonValue, join_key(path, "per"), "unknown name '" + per + "' (one of 'request', 'cache')");
    }
    b.per_request = per == "request";
  }
  b.limit = get_range(require(j, path, "limit"), join_key(path, "limit"), 1, kMaxRows - 1, "resident bound");
  return b;
}

TraceHeader read_header(const json& j) {
  check_keys(j, "",
             {"kvcheck_trace", "name", "window", "capacity", "states", "addressing", "block_size", "pool_blocks",
              "resident_bound", "cache", "expect", "layer_windows"});
  const json& version = require(j, "", "kvcheck_trace");
  if (get_i64(version, "kvcheck_trace") != kTraceVersion) {
    fail(ErrorId::kJsonValue, "kvcheck_trace",
         "unsupported trace version " + version.dump() + " (this build reads " +
             std::to_string(kTraceVersion) + ")");
  }
  TraceHeader h;
  h.name = get_string(require(j, "", "name"), "name");
  if (h.name.empty()) fail(ErrorId::kJsonValue, "name", "name is empty");
  if (h.name.size() > 200) fail(ErrorId::kJsonValue, "name", "name is longer than 200 bytes");
  for (const char ch : h.name) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7F) fail(ErrorId::kJsonValue, "name", "name contains a control character");
  }
  const json& w = as_object(require(j, "", "window"), "window");
  check_keys(w, "window", {"param", "convention", "keys"});
  h.window = get_range(require(w, "window", "param"), "window.param", 1, kMaxRows - 1, "window");
  h.convention =
      get_enum(require(w, "window", "convention"), "window.convention", kConventions, convention_name);
  if (const json* k = find(w, "keys")) {
    const std::int64_t keys = get_i64(*k, "window.keys");
    if (keys != trace_window_keys(h)) {
      fail(ErrorId::kJsonValue, "window.keys",
           "keys " + std::to_string(keys) + " disagrees with param " + std::to_string(h.window) +
               " under convention '" + std::string(convention_name(h.convention)) + "' (" +
               std::to_string(trace_window_keys(h)) + " keys)");
    }
  }
  if (const json* v = find(j, "layer_windows")) {
    // One entry per layer, as an exec open's: {"param", "convention", "keys"},
    // all three null for a global layer; keys optional.
    as_array(*v, "layer_windows");
    for (std::size_t i = 0; i < v->size(); ++i) {
      const std::string p = join_index("layer_windows", i);
      const json& e = as_object((*v)[i], p);
      check_keys(e, p, {"param", "convention", "keys"});
      const json& param = require(e, p, "param");
      if (param.is_null()) {
        for (const char* key : {"convention", "keys"}) {
          if (const json* x = find(e, key); x != nullptr && !x->is_null()) {
            fail(ErrorId::kJsonValue, join_key(p, key), "a global layer (param null) has no " + std::string(key));
          }
        }
        h.layer_windows.push_back(LayerWindow{std::nullopt, Convention::kKeys});
        continue;
      }
      LayerWindow lw;
      lw.window = get_range(param, join_key(p, "param"), 1, kMaxRows - 1, "window");
      lw.convention = get_enum(require(e, p, "convention"), join_key(p, "convention"), kConventions, convention_name);
      if (const json* k = find(e, "keys")) {
        const std::int64_t want = lw.convention == Convention::kKeys ? *lw.window : *lw.window + 1;
        if (get_i64(*k, join_key(p, "keys")) != want) {
          fail(ErrorId::kJsonValue, join_key(p, "keys"),
               "keys disagree with param " + std::to_string(*lw.window) + " under convention '" +
                   std::string(convention_name(lw.convention)) + "' (" + std::to_string(want) + " keys)");
        }
      }
      h.layer_windows.push_back(lw);
    }
  }
  if (const json* v = find(j, "capacity"))
    h.capacity = get_range(*v, "capacity", 1, kMaxRows - 1, "capacity");
  if (const json* v = find(j, "states")) h.states = get_range(*v, "states", 1, kMaxRows - 1, "states");
  h.addressing = get_enum(require(j, "", "addressing"), "addressing", kAddressings, addressing_name);
  if (h.addressing == Addressing::kRing && !h.capacity) {
    fail(ErrorId::kJsonMissingKey, "capacity",
         "ring addressing needs capacity (the slots of state b are b*capacity .. (b+1)*capacity - 1)");
  }
  if (const json* v = find(j, "block_size")) {
    if (h.addressing != Addressing::kPaged) {
      fail(ErrorId::kJsonValue, "block_size",
           "a block size needs addressing \"paged\" (addressing is \"" +
               std::string(addressing_name(h.addressing)) + "\")");
    }
    h.block_size = get_range(*v, "block_size", 1, kMaxRows - 1, "block_size");
  }
  if (const json* v = find(j, "pool_blocks")) {
    if (h.block_size == 0) fail(ErrorId::kJsonValue, "pool_blocks", "pool_blocks needs a block_size");
    h.pool_blocks = get_range(*v, "pool_blocks", 1, kMaxRows - 1, "pool_blocks");
  }
  if (const json* v = find(j, "resident_bound")) h.resident_bound = read_resident_bound(*v, h, "resident_bound");
  if (const json* v = find(j, "cache")) h.cache = read_trace_cache(*v, "cache");
  // The ranges of "expect" are checked against the schedule by `kvcheck
  // audit`, which validates the scenario of the run.
  if (const json* v = find(j, "expect")) h.expect = read_expectations(*v, "expect");
  return h;
}

// ---- step records ------------------------------------------------------------------------

std::vector<std::int64_t> int_list(const json& j, const std::string& path, std::int64_t lo, std::int64_t hi,
                                   std::string_view what) {
  as_array(j, path);
  std::vector<std::int64_t> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i)
    out.push_back(get_range(j[i], join_index(path, i), lo, hi, what));
  return out;
}

void check_count_of(const json& j, const std::string& path, std::int64_t rows, std::string_view per) {
  if (static_cast<std::int64_t>(j.size()) != rows) {
    fail(ErrorId::kJsonValue, path,
         "has " + std::to_string(j.size()) + " entries, expected " + std::to_string(rows) + " (" +
             std::string(per) + ")");
  }
}

/// Rows of numbers: `rows` arrays of `width` numbers each (width < 0: any).
std::vector<std::vector<double>> real_rows(const json& j, const std::string& path, std::int64_t rows,
                                           std::int64_t width, std::string_view width_rule) {
  as_array(j, path);
  check_count_of(j, path, rows, "one per row of the step");
  std::vector<std::vector<double>> out;
  out.reserve(j.size());
  for (std::size_t r = 0; r < j.size(); ++r) {
    const std::string rp = join_index(path, r);
    as_array(j[r], rp);
    if (width >= 0 && static_cast<std::int64_t>(j[r].size()) != width) {
      fail(ErrorId::kJsonValue, rp,
           "has " + std::to_string(j[r].size()) + " values, expected " + std::string(width_rule) + " = " +
               std::to_string(width));
    }
    std::vector<double> row;
    row.reserve(j[r].size());
    for (std::size_t e = 0; e < j[r].size(); ++e) row.push_back(get_f64(j[r][e], join_index(rp, e)));
    out.push_back(std::move(row));
  }
  return out;
}

void check_block_table(const BlockTable& t, std::int64_t keys) {
  for (std::size_t b = 0; b < t.blocks.size(); ++b) {
    std::int64_t last = 0;
    if (t.blocks[b] >= 0 && (__builtin_mul_overflow(t.blocks[b], t.block_size, &last) ||
                             __builtin_add_overflow(last, t.block_size - 1, &last))) {
      fail(ErrorId::kSize, join_index("block_table.blocks", b), "block id * block_size overflows 64 bits");
    }
  }
  std::int64_t total = 0;
  for (std::size_t i = 0; i < t.seq_lens.size(); ++i) {
    const std::int64_t len = t.seq_lens[i];
    if (len == 0) continue;
    const std::int64_t last_block = (len - 1) / t.block_size;
    if (last_block >= static_cast<std::int64_t>(t.blocks.size())) {
      fail(ErrorId::kJsonValue, join_index("block_table.seq_lens", i),
           "seq_len " + std::to_string(len) + " reads position " + std::to_string(len - 1) + " in block " +
               std::to_string(last_block) + ", beyond the " + std::to_string(t.blocks.size()) +
               " blocks of the table");
    }
    total += std::min(len, keys);
    if (total > kMaxExpandedReads) {
      fail(
          ErrorId::kSize, join_index("block_table.seq_lens", i),
          "the block table expands to more than " + std::to_string(kMaxExpandedReads) + " reads in one step");
    }
  }
}

TraceStep read_step(const json& j, const TraceHeader& h, std::int64_t line) {
  TraceStep s;
  s.line = line;
  s.kind = get_enum(require(j, "", "kind"), "kind", kKinds, trace_kind_name);
  const std::string owner = "a " + std::string(trace_kind_name(s.kind)) + " record";
  std::vector<std::string_view> allowed = {"step",    "layer",  "kind",  "request", "state",
                                           "refused", "padded", "moved", "freed",   "cached"};
  if (s.kind == TraceKind::kBegin) allowed.insert(allowed.end(), {"prefix", "written", "recompute"});
  const bool writes = trace_kind_writes(s.kind);
  if (writes) {
    allowed.insert(allowed.end(), {"position", "rows", "written", "read", "block_table", "read_view", "k",
                                   "v", "q", "out", "recomputed"});
  }
  const StepFields fields = trace_kind_fields(s.kind);
  if (fields == StepFields::kRowsOrder) allowed.push_back("order");
  if (fields == StepFields::kDrafts) allowed.push_back("drafts");
  if (fields == StepFields::kAccepted) allowed.push_back("accepted");
  if (fields == StepFields::kPositions) allowed.push_back("positions");
  check_keys(j, "", allowed, owner);

  s.step = get_range(require(j, "", "step", owner), "step", 0, kMaxRows, "step");
  s.layer =
      static_cast<std::int32_t>(get_range(require(j, "", "layer", owner), "layer", 0, kI32Max - 1, "layer"));
  s.request = get_range(require(j, "", "request", owner), "request", 0,
                        std::numeric_limits<std::int64_t>::max(), "request");
  s.state = get_range(require(j, "", "state", owner), "state", 0, kMaxRows - 2, "state");
  if (const json* v = find(j, "refused")) {
    s.refused = get_string(*v, "refused");
    if (s.refused->empty()) fail(ErrorId::kJsonValue, "refused", "a refusal needs a code (\"code: detail\")");
  }
  if (h.cache && h.cache->layers && s.layer >= *h.cache->layers) {
    fail(ErrorId::kJsonValue, "layer",
         "layer " + std::to_string(s.layer) + " is outside 0.." + std::to_string(*h.cache->layers - 1) +
             " (the header's cache.layers)");
  }
  if (fields == StepFields::kAccepted) {
    s.accepted = get_range(require(j, "", "accepted", owner), "accepted", 0, kMaxDrafts, "accepted");
  }
  if (fields == StepFields::kPositions) {
    s.positions = get_range(require(j, "", "positions", owner), "positions", 1, kMaxRows - 1, "positions");
  }
  if (const json* p = find(j, "prefix")) {
    // A begin from a shared prefix: which request, how many positions, and
    // optionally where the cache stored rows again (-1: shared).
    const json& o = as_object(*p, "prefix");
    check_keys(o, "prefix", {"request", "positions"}, "a prefix");
    s.prefix = Prefix{get_range(require(o, "prefix", "request", "a prefix"), "prefix.request", 0,
                                std::numeric_limits<std::int64_t>::max(), "request"),
                      get_range(require(o, "prefix", "positions", "a prefix"), "prefix.positions", 1, kMaxRows - 1,
                                "positions")};
    // A prefix of the request itself is the begin that resumes it after a
    // preempt (docs/semantics.md "Preemption"); a request's first begin
    // from itself is refused where the trace becomes a scenario.
    if (const json* w = find(j, "written")) {
      s.written = int_list(*w, "written", -1, kSlotMax, "slot");
      check_count_of(*w, "written", s.prefix->positions, "one slot per prefix position (-1: shared)");
    }
    // Positions left to the request's next writing step (docs/semantics.md "Recompute in a step").
    if (const json* r = find(j, "recompute")) {
      s.recompute = int_list(*r, "recompute", 0, s.prefix->positions - 1, "prefix position");
      if (static_cast<std::int64_t>(s.recompute.size()) > s.prefix->positions)
        fail(ErrorId::kJsonValue, "recompute", "more positions than the prefix has");
    }
  } else if (s.kind == TraceKind::kBegin && (find(j, "written") || find(j, "recompute"))) {
    fail(ErrorId::kJsonValue, find(j, "written") ? "written" : "recompute",
         "only a begin from a shared prefix reports written slots or positions to recompute");
  }
  // Slot events of any step (a refused one has none).
  for (const char* key : {"padded", "moved", "freed", "cached"}) {
    if (s.refused && find(j, key)) fail(ErrorId::kJsonValue, key, "a refused step reports no slots or outputs");
  }
  if (const json* v = find(j, "padded")) s.padded = int_list(*v, "padded", 0, kSlotMax, "slot");
  if (const json* v = find(j, "freed")) s.freed = int_list(*v, "freed", 0, kSlotMax, "slot");
  if (const json* v = find(j, "cached")) s.cached = int_list(*v, "cached", 0, kSlotMax, "slot");
  if (const json* v = find(j, "moved")) {
    as_array(*v, "moved");
    for (std::size_t i = 0; i < v->size(); ++i) {
      const std::string pi = join_index("moved", i);
      const std::vector<std::int64_t> pair = int_list((*v)[i], pi, 0, kSlotMax, "slot");
      if (pair.size() != 2) fail(ErrorId::kJsonValue, pi, "expected [from, to]: two slots");
      s.moved.emplace_back(pair[0], pair[1]);
    }
  }
  if (!writes) return s;

  s.position = get_range(require(j, "", "position", owner), "position", 0, kMaxRows - 1, "position");
  if (const json* v = find(j, "recomputed")) {
    if (s.refused) fail(ErrorId::kJsonValue, "recomputed", "a refused step reports no slots or outputs");
    as_array(*v, "recomputed");
    for (std::size_t i = 0; i < v->size(); ++i) {
      const std::string pi = join_index("recomputed", i);
      const std::vector<std::int64_t> pair = int_list((*v)[i], pi, 0, kSlotMax, "position or slot");
      if (pair.size() != 2) fail(ErrorId::kJsonValue, pi, "expected [position, slot]");
      if (pair[0] >= s.position)
        fail(ErrorId::kJsonValue, join_index(pi, 0),
             "position " + std::to_string(pair[0]) + " is not below the step's first position " +
                 std::to_string(s.position));
      s.recomputed.emplace_back(pair[0], pair[1]);
    }
  }
  if (fields == StepFields::kRowsOrder) {
    s.rows = get_range(require(j, "", "rows", owner), "rows", 1, kMaxPrefillRows, "prefill rows");
    s.order = get_enum(require(j, "", "order", owner), "order", kOrders, order_name);
  }
  if (fields == StepFields::kDrafts) {
    s.drafts = get_range(require(j, "", "drafts", owner), "drafts", 0, kMaxDrafts, "drafts");
  }
  const StepRows rule = step_kind_info(trace_step_kind(s.kind)).rows;
  if (rule != StepRows::kGiven) {
    // Rows follow from the kind (decode 1, verify k + 1); a "rows" key must agree.
    s.rows = step_kind_rows(trace_step_kind(s.kind), 0, s.drafts);
    if (const json* v = find(j, "rows"); v != nullptr && get_i64(*v, "rows") != s.rows) {
      fail(ErrorId::kJsonValue, "rows",
           "rows " + v->dump() + ", but a " + std::string(trace_kind_name(s.kind)) + " record writes " +
               std::to_string(s.rows) + (rule == StepRows::kDraftsPlusOne ? " (drafts + 1)" : ""));
    }
  }
  const std::int64_t n = s.rows;
  if (s.refused) {
    for (const char* key : {"written", "read", "block_table", "out"}) {
      if (find(j, key)) fail(ErrorId::kJsonValue, key, "a refused step reports no slots or outputs");
    }
  } else {
    const json& w = require(j, "", "written", owner);
    s.written = int_list(w, "written", 0, kSlotMax, "slot");
    check_count_of(w, "written", n, "one slot per row");
    const json* r = find(j, "read");
    const json* bt = find(j, "block_table");
    if (r && bt) fail(ErrorId::kJsonValue, "block_table", "give either read or block_table, not both");
    if (!r && !bt)
      fail(ErrorId::kJsonMissingKey, "read", "missing required key 'read' (or 'block_table') of " + owner);
    if (r) {
      s.read_form = ReadForm::kSlots;
      as_array(*r, "read");
      check_count_of(*r, "read", n, "one list per query");
      for (std::size_t i = 0; i < r->size(); ++i)
        s.read.push_back(int_list((*r)[i], join_index("read", i), -1, kSlotMax, "slot"));
    } else {
      s.read_form = ReadForm::kBlockTable;
      as_object(*bt, "block_table");
      check_keys(*bt, "block_table", {"blocks", "block_size", "seq_lens"});
      s.block_table.blocks =
          int_list(require(*bt, "block_table", "blocks"), "block_table.blocks", -1, kSlotMax, "block id");
      s.block_table.block_size = get_range(require(*bt, "block_table", "block_size"),
                                           "block_table.block_size", 1, kMaxRows - 1, "block_size");
      const json& sl = require(*bt, "block_table", "seq_lens");
      s.block_table.seq_lens = int_list(sl, "block_table.seq_lens", 0, kMaxRows, "seq_len");
      check_count_of(sl, "block_table.seq_lens", n, "one per query");
      check_block_table(s.block_table, trace_window_keys(h));
    }
    if (const json* v = find(j, "read_view"))
      s.read_view = get_enum(*v, "read_view", kReadViews, read_view_name);
  }
  const std::int64_t kv_width = h.cache ? std::int64_t{h.cache->kv_heads} * h.cache->head_dim : -1;
  const std::int64_t q_width = h.cache ? std::int64_t{h.cache->q_heads} * h.cache->head_dim : -1;
  if (const json* v = find(j, "k")) s.k = real_rows(*v, "k", n, kv_width, "kv_heads*head_dim");
  if (const json* v = find(j, "v")) {
    if (h.cache && h.cache->shared_row)
      fail(ErrorId::kJsonValue, "v", "a shared key/value row has no v (k is the value)");
    s.v = real_rows(*v, "v", n, kv_width, "kv_heads*head_dim");
  }
  if (const json* v = find(j, "q")) s.q = real_rows(*v, "q", n, q_width, "q_heads*head_dim");
  if (const json* v = find(j, "out")) s.out = real_rows(*v, "out", n, q_width, "q_heads*head_dim");
  return s;
}

// ---- record order of one run --------------------------------------------------------------

[[noreturn]] void fail_at(ErrorId id, std::int64_t line, const std::string& path, const std::string& rule) {
  fail(id, at_line(line, path), rule);
}

void check_run(const TraceRun& run) {
  if (run.steps.empty()) return;
  std::int32_t layers = 0;
  for (const TraceStep& s : run.steps) layers = std::max(layers, s.layer + 1);
  if (run.header.cache && run.header.cache->layers) layers = *run.header.cache->layers;

  const TraceStep* first = nullptr;  // first step record (not begin) of the current step index
  const TraceStep* prev = nullptr;
  std::vector<bool> seen;  // step records per layer of the current step
  std::optional<std::int64_t> refused_line;
  const TraceStep* pending_begin = nullptr;  // a begin awaiting its step record

  auto close_step = [&](const TraceStep& last) {
    // Every layer of a step has its record, unless a refusal ended the run there.
    if (pending_begin != nullptr && !refused_line) {
      fail_at(ErrorId::kJsonValue, pending_begin->line, "kind",
              "a begin record of step " + std::to_string(last.step) + " layer " +
                  std::to_string(pending_begin->layer) + " without the step record that follows it");
    }
    std::int32_t expected = layers;
    if (refused_line) expected = last.layer;  // layers before the refused call
    for (std::int32_t l = 0; l < expected; ++l) {
      if (!seen[static_cast<std::size_t>(l)]) {
        fail_at(ErrorId::kJsonValue, last.line, "step",
                "step " + std::to_string(last.step) + " has no record for layer " + std::to_string(l) +
                    " (the run has " + std::to_string(layers) + " layers; every step runs on each)");
      }
    }
  };

  for (const TraceStep& s : run.steps) {
    if (refused_line) {
      fail_at(ErrorId::kJsonValue, s.line, "",
              "a record after the refusal on line " + std::to_string(*refused_line) +
                  " (a refusal ends the run)");
    }
    const std::int64_t expected_step = prev == nullptr ? 0 : prev->step;
    if (prev == nullptr ? s.step != 0 : (s.step != prev->step && s.step != prev->step + 1)) {
      fail_at(ErrorId::kJsonValue, s.line, "step",
              "step " + std::to_string(s.step) + " out of order (expected " + std::to_string(expected_step) +
                  (prev == nullptr ? "" : " or " + std::to_string(expected_step + 1)) + ")");
    }
    if (prev != nullptr && s.step != prev->step) {
      close_step(*prev);
      first = nullptr;
    }
    if (prev == nullptr || s.step != prev->step) seen.assign(static_cast<std::size_t>(layers), false);
    const bool is_begin = s.kind == TraceKind::kBegin;
    // Order inside a step: layers ascending, a layer's begin before its step record.
    if (prev != nullptr && prev->step == s.step) {
      const auto key = [](const TraceStep& r) {
        return std::pair(r.layer, r.kind == TraceKind::kBegin ? 0 : 1);
      };
      if (!(key(*prev) < key(s))) {
        fail_at(ErrorId::kJsonValue, s.line, "layer",
                "records of step " + std::to_string(s.step) +
                    " come one per layer, layers ascending, each layer's begin before its step record");
      }
    }
    if (pending_begin != nullptr &&
        (is_begin || s.layer != pending_begin->layer || s.step != pending_begin->step)) {
      fail_at(ErrorId::kJsonValue, pending_begin->line, "kind",
              "a begin record of step " + std::to_string(pending_begin->step) + " layer " +
                  std::to_string(pending_begin->layer) + " without the step record that follows it");
    }
    if (is_begin) {
      pending_begin = &s;
    } else {
      if (pending_begin != nullptr) {
        const TraceStep* b = pending_begin;
        if (b->request != s.request) {
          fail_at(ErrorId::kJsonValue, b->line, "request",
                  "begin of request " + std::to_string(b->request) + ", but step " + std::to_string(s.step) +
                      " (line " + std::to_string(s.line) + ") is of request " + std::to_string(s.request));
        }
        if (b->state != s.state) {
          fail_at(ErrorId::kJsonValue, b->line, "state",
                  "begin on state " + std::to_string(b->state) + ", but step " + std::to_string(s.step) +
                      " (line " + std::to_string(s.line) + ") runs on state " + std::to_string(s.state));
        }
        pending_begin = nullptr;
      }
      seen[static_cast<std::size_t>(s.layer)] = true;
      if (first == nullptr) {
        first = &s;
      } else {
        // Every layer runs the same step.
        const auto agree = [&](bool same, const char* path, const std::string& what) {
          if (!same) {
            fail_at(ErrorId::kJsonValue, s.line, path,
                    std::string(path) + " " + what + " disagrees with layer " + std::to_string(first->layer) +
                        " of step " + std::to_string(s.step) + " (line " + std::to_string(first->line) + ")");
          }
        };
        agree(s.kind == first->kind, "kind", "'" + std::string(trace_kind_name(s.kind)) + "'");
        agree(s.request == first->request, "request", std::to_string(s.request));
        agree(s.state == first->state, "state", std::to_string(s.state));
        agree(s.position == first->position, "position", std::to_string(s.position));
        agree(s.rows == first->rows, "rows", std::to_string(s.rows));
        agree(s.order == first->order, "order", "'" + std::string(order_name(s.order)) + "'");
        agree(s.drafts == first->drafts, "drafts", std::to_string(s.drafts));
        agree(s.accepted == first->accepted, "accepted", std::to_string(s.accepted));
        agree(s.positions == first->positions, "positions", std::to_string(s.positions));
      }
    }
    if (s.refused) refused_line = s.line;
    prev = &s;
  }
  close_step(*prev);
}

std::string errno_text(int error) {
  return std::strerror(error);
}

// ---- writing ---------------------------------------------------------------------------------

ojson rows_json(const std::vector<std::vector<double>>& rows) {
  ojson out = ojson::array();
  for (const auto& r : rows) out.push_back(r);
  return out;
}

std::string dump_line(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::strict) + "\n";
}

}  // namespace

// ---- public API ------------------------------------------------------------------------------

std::string_view trace_kind_name(TraceKind k) noexcept {
  return k == TraceKind::kBegin ? std::string_view("begin") : step_kind_name(trace_step_kind(k));
}

std::string_view addressing_name(Addressing a) noexcept {
  switch (a) {
    case Addressing::kRing: return "ring";
    case Addressing::kPaged: return "paged";
    case Addressing::kOpaque: return "opaque";
  }
  return "?";
}

std::string_view read_view_name(TraceReadView v) noexcept {
  switch (v) {
    case TraceReadView::kAfterWrites: return "after_writes";
    case TraceReadView::kCausal: return "causal";
  }
  return "?";
}

std::vector<TraceRun> parse_trace(std::string_view text, const std::string& source) {
  try {
    std::vector<TraceRun> runs;
    std::size_t begin = 0;
    std::int64_t line = 0;
    while (begin < text.size()) {
      std::size_t end = text.find('\n', begin);
      if (end == std::string_view::npos) end = text.size();
      std::string_view content = text.substr(begin, end - begin);
      begin = end + 1;
      ++line;
      if (!content.empty() && content.back() == '\r') content.remove_suffix(1);
      if (content.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
      try {
        const json root = parse_document(content, /*one_line=*/true);
        if (!root.is_object()) type_error(root, "", "an object (a header or a step record)");
        if (root.contains("kvcheck_trace")) {
          TraceRun run;
          run.source = source;
          run.header_line = line;
          run.header = read_header(root);
          runs.push_back(std::move(run));
        } else if (root.contains("step")) {
          if (runs.empty()) {
            fail(ErrorId::kJsonValue, "",
                 "a step record before any header (a run starts with {\"kvcheck_trace\":1,...})");
          }
          runs.back().steps.push_back(read_step(root, runs.back().header, line));
        } else {
          fail(ErrorId::kJsonMissingKey, "step",
               "neither a header (key 'kvcheck_trace') nor a step record (key 'step')");
        }
      } catch (const Error& e) {
        throw Error(e.id(), at_line(line, e.where()), e.rule());
      }
    }
    for (const TraceRun& run : runs) check_run(run);
    if (runs.empty()) fail(ErrorId::kJsonValue, "line 1", "the trace has no header line");
    return runs;
  } catch (const Error& e) {
    if (source.empty()) throw;
    throw Error(e.id(), e.where(), e.rule() + " (in " + source + ")");
  }
}

std::vector<TraceRun> load_trace_file(const std::filesystem::path& path) {
  return parse_trace(read_input_file(path, "a trace file"), path.string());
}

std::vector<std::filesystem::path> collect_trace_files(const std::vector<std::string>& files_or_dirs) {
  return collect_files(files_or_dirs,
                       [](const std::filesystem::path& p) { return p.extension() == ".jsonl"; });
}

std::vector<std::vector<std::int64_t>> trace_read_slots(const TraceStep& s, std::int64_t window_keys) {
  if (s.read_form == ReadForm::kSlots) return s.read;
  std::vector<std::vector<std::int64_t>> out;
  if (s.read_form == ReadForm::kNone) return out;
  const BlockTable& t = s.block_table;
  try {
    check_block_table(t, window_keys);
  } catch (const Error& e) {
    throw Error(e.id(), at_line(s.line, e.where()), e.rule());
  }
  for (const std::int64_t len : t.seq_lens) {
    std::vector<std::int64_t> slots;
    for (std::int64_t pos = std::max<std::int64_t>(0, len - window_keys); pos < len; ++pos) {
      const std::int64_t block = t.blocks[static_cast<std::size_t>(pos / t.block_size)];
      if (block >= 0) slots.push_back(block * t.block_size + pos % t.block_size);
    }
    out.push_back(std::move(slots));
  }
  return out;
}

std::string trace_header_line(const TraceHeader& h) {
  ojson j = ojson::object();
  j["kvcheck_trace"] = kTraceVersion;
  j["name"] = h.name;
  ojson w = ojson::object();
  w["param"] = h.window;
  w["convention"] = convention_name(h.convention);
  w["keys"] = trace_window_keys(h);
  j["window"] = std::move(w);
  if (!h.layer_windows.empty()) {  // only when listed: other traces keep their bytes
    ojson layers = ojson::array();
    for (std::size_t l = 0; l < h.layer_windows.size(); ++l) {
      const LayerWindow& lw = h.layer_windows[l];
      ojson e = ojson::object();
      if (lw.window) {
        e["param"] = *lw.window;
        e["convention"] = convention_name(lw.convention);
        e["keys"] = trace_layer_window_keys(h, static_cast<std::int32_t>(l));
      } else {
        e["param"] = nullptr;
        e["convention"] = nullptr;
        e["keys"] = nullptr;
      }
      layers.push_back(std::move(e));
    }
    j["layer_windows"] = std::move(layers);
  }
  if (h.capacity) j["capacity"] = *h.capacity;
  if (h.states) j["states"] = *h.states;
  j["addressing"] = addressing_name(h.addressing);
  if (h.block_size > 0) {  // only for a paged cache: other traces keep their bytes
    j["block_size"] = h.block_size;
    if (h.pool_blocks) j["pool_blocks"] = *h.pool_blocks;
  }
  if (h.resident_bound) {  // only when the cache declared one: other traces keep their bytes
    ojson b = ojson::object();
    b["unit"] = h.resident_bound->blocks ? "blocks" : "rows";
    b["per"] = h.resident_bound->per_request ? "request" : "cache";
    b["limit"] = h.resident_bound->limit;
    j["resident_bound"] = std::move(b);
  }
  if (h.cache) {
    const TraceCache& c = *h.cache;
    ojson cache = ojson::object();
    cache["q_heads"] = c.q_heads;
    cache["kv_heads"] = c.kv_heads;
    cache["head_dim"] = c.head_dim;
    cache["shared_row"] = c.shared_row;
    cache["format"] = format_name(c.format);
    cache["rope"] = rope_document(c.rope);
    if (c.layers) cache["layers"] = *c.layers;
    cache["softmax_scale"] = optional_number(c.softmax_scale);
    cache["sink_logit"] = optional_number(c.sink_logit);
    j["cache"] = std::move(cache);
  }
  if (h.expect) j["expect"] = expectations_document(*h.expect);
  return dump_line(j);
}

std::string trace_step_line(const TraceStep& s) {
  ojson j = ojson::object();
  j["step"] = s.step;
  j["layer"] = s.layer;
  j["kind"] = trace_kind_name(s.kind);
  j["request"] = s.request;
  j["state"] = s.state;
  if (trace_kind_writes(s.kind)) {
    j["position"] = s.position;
    j["rows"] = s.rows;
    if (trace_kind_fields(s.kind) == StepFields::kRowsOrder) j["order"] = order_name(s.order);
    if (trace_kind_fields(s.kind) == StepFields::kDrafts) j["drafts"] = s.drafts;
    if (!s.refused) {
      j["written"] = s.written;
      if (s.read_form == ReadForm::kBlockTable) {
        ojson t = ojson::object();
        t["blocks"] = s.block_table.blocks;
        t["block_size"] = s.block_table.block_size;
        t["seq_lens"] = s.block_table.seq_lens;
        j["block_table"] = std::move(t);
      } else {
        ojson read = ojson::array();
        for (const auto& r : s.read) read.push_back(r);
        j["read"] = std::move(read);
      }
      j["read_view"] = read_view_name(s.read_view);
    }
    if (!s.k.empty()) j["k"] = rows_json(s.k);
    if (!s.v.empty()) j["v"] = rows_json(s.v);
    if (!s.q.empty()) j["q"] = rows_json(s.q);
    if (!s.out.empty() && !s.refused) j["out"] = rows_json(s.out);
  }
  if (trace_kind_fields(s.kind) == StepFields::kAccepted) j["accepted"] = s.accepted;
  if (trace_kind_fields(s.kind) == StepFields::kPositions) j["positions"] = s.positions;
  if (s.kind == TraceKind::kBegin && s.prefix) {
    j["prefix"] = ojson{{"request", s.prefix->request}, {"positions", s.prefix->positions}};
    if (!s.written.empty()) j["written"] = s.written;
    if (!s.recompute.empty()) j["recompute"] = s.recompute;
  }
  if (!s.recomputed.empty()) {
    ojson recomputed = ojson::array();
    for (const auto& [p, slot] : s.recomputed) recomputed.push_back(ojson::array({p, slot}));
    j["recomputed"] = std::move(recomputed);
  }
  if (!s.padded.empty()) j["padded"] = s.padded;
  if (!s.moved.empty()) {
    ojson moved = ojson::array();
    for (const auto& [from, to] : s.moved) moved.push_back(ojson::array({from, to}));
    j["moved"] = std::move(moved);
  }
  if (!s.freed.empty()) j["freed"] = s.freed;
  if (!s.cached.empty()) j["cached"] = s.cached;
  if (s.refused) j["refused"] = *s.refused;
  return dump_line(j);
}

TraceWriter::TraceWriter(const std::filesystem::path& path) : path_(path.string()) {
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) fail(ErrorId::kIo, path_, "cannot open for writing: " + errno_text(errno));
}

TraceWriter::~TraceWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TraceWriter::append(std::string_view lines) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) {
    text_.append(lines);
    return;
  }
  if (!failure_.empty()) fail(ErrorId::kIo, path_, failure_);
  if (std::fwrite(lines.data(), 1, lines.size(), file_) != lines.size() || std::fflush(file_) != 0) {
    failure_ = "write failed: " + errno_text(errno);
    fail(ErrorId::kIo, path_, failure_);
  }
}

void TraceWriter::check() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty()) fail(ErrorId::kIo, path_, failure_);
}

std::string TraceWriter::text() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return text_;
}

}  // namespace kvcheck::scenarios
