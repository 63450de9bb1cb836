// Scenario validation: the cache configuration, then the schedule simulated
// step by step with the step semantics (scenarios/step_semantics.hpp), then
// the data and the expectations against what the simulation found. Every
// refusal names the JSON path at fault.
#include "scenarios/scenario_json.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "scenarios/json_read.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/error.hpp"

namespace kvcheck::scenarios {
namespace {

using namespace json_read;

// ---- validation -----------------------------------------------------------------------

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    for (std::size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values beyond U+10FFFF are invalid.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

void check_count(std::int64_t value, std::int64_t lo, std::int64_t hi, const std::string& path,
                 std::string_view what) {
  if (value < lo) {
    fail(ErrorId::kSize, path,
         std::string(what) + " " + std::to_string(value) + " is below " + std::to_string(lo));
  }
  if (value > hi) {
    fail(ErrorId::kSize, path,
         std::string(what) + " " + std::to_string(value) + " exceeds " + std::to_string(hi));
  }
}

/// Visible keys of the window parameter under its convention (docs/semantics.md "Windows", model/visible.hpp).
std::int64_t window_keys(const CacheConfig& c) {
  return c.convention == Convention::kKeys ? c.window : c.window + 1;
}

void validate_cache(const CacheConfig& c) {
  check_count(c.window, 1, kMaxRows - 1, "cache.window", "window");
  check_count(c.ring_rows, 1, kMaxRows - 1, "cache.ring_rows", "ring_rows");
  check_count(c.states, 1, kMaxRows - 1, "cache.states", "states");
  check_count(c.q_heads, 1, std::numeric_limits<std::int32_t>::max(), "cache.q_heads", "q_heads");
  check_count(c.kv_heads, 1, std::numeric_limits<std::int32_t>::max(), "cache.kv_heads", "kv_heads");
  check_count(c.head_dim, 1, std::numeric_limits<std::int32_t>::max(), "cache.head_dim", "head_dim");
  check_count(c.layers, 1, std::numeric_limits<std::int32_t>::max(), "cache.layers", "layers");
  if (c.pool_blocks) check_count(*c.pool_blocks, 1, kMaxRows - 1, "cache.pool_blocks", "pool_blocks");
  if (!c.layer_windows.empty()) {
    if (c.layer_windows.size() != static_cast<std::size_t>(c.layers)) {
      fail(ErrorId::kJsonValue, "cache.layer_windows",
           "lists " + std::to_string(c.layer_windows.size()) + " layer windows for " + std::to_string(c.layers) +
               " layers (one per layer)");
    }
    for (std::size_t l = 0; l < c.layer_windows.size(); ++l) {
      const LayerWindow& w = c.layer_windows[l];
      if (!w.window) continue;  // a global layer
      check_count(*w.window, 1, kMaxRows - 1, "cache.layer_windows[" + std::to_string(l) + "].window", "window");
    }
  }
  if (c.q_heads % c.kv_heads != 0) {
    fail(ErrorId::kJsonValue, "cache.q_heads",
         "q_heads " + std::to_string(c.q_heads) + " is not a multiple of kv_heads " +
             std::to_string(c.kv_heads));
  }
  if (c.shared_row && c.kv_heads != 1) {
    fail(ErrorId::kJsonValue, "cache.shared_row",
         "a shared key/value row needs kv_heads 1, found " + std::to_string(c.kv_heads));
  }
  const std::int32_t dims = c.rope.rotary_dims;
  if (c.rope.style == RopeStyle::kNone) {
    if (dims != 0) {
      fail(ErrorId::kJsonValue, "cache.rope.rotary_dims",
           "rotary_dims must be 0 when rope style is 'none', found " + std::to_string(dims));
    }
  } else if (dims < 2 || dims % 2 != 0 || dims > c.head_dim) {
    fail(ErrorId::kJsonValue, "cache.rope.rotary_dims",
         "rotary_dims " + std::to_string(dims) + " must be even, at least 2 and at most head_dim " +
             std::to_string(c.head_dim));
  }
  check_real(c.rope.base, "cache.rope.base");
  if (!(c.rope.base > 0)) fail(ErrorId::kJsonValue, "cache.rope.base", "base must be positive");
  if (c.softmax_scale) {
    check_real(*c.softmax_scale, "cache.softmax_scale");
    if (!(*c.softmax_scale > 0)) {
      fail(ErrorId::kJsonValue, "cache.softmax_scale", "softmax_scale must be positive");
    }
  }
  if (c.sink_logit) check_real(*c.sink_logit, "cache.sink_logit");

  // Bytes of the pool at 8 bytes per element (the widest format):
  // layers * states * ring_rows * kv_heads * head_dim * (1 shared or 2) * 8.
  std::int64_t bytes = 8 * (c.shared_row ? 1 : 2);
  bool overflow = false;
  for (std::int64_t factor :
       {std::int64_t{c.layers}, c.states, c.ring_rows, std::int64_t{c.kv_heads}, std::int64_t{c.head_dim}}) {
    overflow = overflow || __builtin_mul_overflow(bytes, factor, &bytes);
  }
  std::int64_t q_bytes = 8;
  for (std::int64_t factor : {std::int64_t{c.q_heads}, std::int64_t{c.head_dim}}) {
    overflow = overflow || __builtin_mul_overflow(q_bytes, factor, &q_bytes);
  }
  if (overflow) {
    fail(ErrorId::kSize, "cache", "layers*states*ring_rows*kv_heads*head_dim*2*8 bytes overflows 64 bits");
  }
}

/// What the schedule simulation learns, used by the data and expect checks.
struct Simulation {
  std::map<std::int64_t, std::int64_t> written_end;  // request -> 1 + highest position written
  std::vector<std::int64_t> first_position;          // per step: position of its first row
};

void check_default_fields(const Step& step, const std::string& p) {
  const Step defaults;
  const std::string owner = "a " + std::string(step_kind_name(step.kind)) + " step";
  const StepFields fields = step_kind_fields(step.kind);
  if (fields != StepFields::kRowsOrder) {
    if (step.rows != defaults.rows)
      fail(ErrorId::kJsonValue, join_key(p, "rows"), "rows is not a field of " + owner);
    if (step.order != defaults.order)
      fail(ErrorId::kJsonValue, join_key(p, "order"), "order is not a field of " + owner);
  }
  if (fields != StepFields::kDrafts && step.drafts != defaults.drafts) {
    fail(ErrorId::kJsonValue, join_key(p, "drafts"), "drafts is not a field of " + owner);
  }
  if (fields != StepFields::kAccepted && step.accepted != defaults.accepted) {
    fail(ErrorId::kJsonValue, join_key(p, "accepted"), "accepted is not a field of " + owner);
  }
  if (fields != StepFields::kPositions && step.positions != defaults.positions) {
    fail(ErrorId::kJsonValue, join_key(p, "positions"), "positions is not a field of " + owner);
  }
}

/// A request beginning at steps[step] from a shared prefix: the request it
/// names has begun (live or finished) and has committed at least n >= 1
/// positions by then. Returns n (0 without a prefix).
std::int64_t check_prefix(const Scenario& s, std::int64_t id, const RequestLifecycle& lifecycle, std::size_t step) {
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    const Request& r = s.requests[i];
    if (r.id != id || !r.prefix) continue;
    const std::string p = join_key(join_index("requests", i), "prefix");
    const Prefix& x = *r.prefix;
    const std::string at = " when request " + std::to_string(id) + " begins (steps[" + std::to_string(step) + "])";
    if (x.request == id) fail(ErrorId::kJsonValue, join_key(p, "request"), "a request cannot start from its own prefix");
    if (lifecycle.phase(x.request) == RequestLifecycle::Phase::kIdle) {
      fail(ErrorId::kJsonValue, join_key(p, "request"),
           "request " + std::to_string(x.request) + " has not begun" + at);
    }
    const std::int64_t committed = lifecycle.progress(x.request).length;
    if (x.positions < 1 || x.positions > committed) {
      fail(ErrorId::kJsonValue, join_key(p, "positions"),
           "prefix of " + std::to_string(x.positions) + " positions is outside 1.." + std::to_string(committed) +
               ", the positions request " + std::to_string(x.request) + " has committed" + at);
    }
    return x.positions;
  }
  return 0;
}

Simulation simulate(const Scenario& s) {
  // Phase, state holders and progress: RequestLifecycle (step_semantics.hpp).
  struct Live {
    std::int64_t state = 0;
    std::int64_t written = 0;              // rows written over the whole schedule
    std::optional<std::size_t> verify_at;  // step index of a pending verify
    std::size_t finished_at = 0;
  };
  std::map<std::int64_t, Live> live;
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    const Request& r = s.requests[i];
    const std::string p = join_index("requests", i);
    if (r.id < 0) {
      fail(ErrorId::kJsonValue, join_key(p, "id"), "request id " + std::to_string(r.id) + " is negative");
    }
    if (r.state < 0 || r.state >= s.cache.states) {
      fail(ErrorId::kJsonValue, join_key(p, "state"),
           "state " + std::to_string(r.state) + " is outside 0.." + std::to_string(s.cache.states - 1));
    }
    if (!live.emplace(r.id, Live{}).second) {
      fail(ErrorId::kJsonValue, join_key(p, "id"), "duplicate request id " + std::to_string(r.id));
    }
    live[r.id].state = r.state;
  }

  Simulation sim;
  RequestLifecycle lifecycle;
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    const Step& step = s.steps[i];
    const std::string p = join_index("steps", i);
    check_default_fields(step, p);
    const auto it = live.find(step.request);
    if (it == live.end()) {
      fail(ErrorId::kJsonValue, join_key(p, "request"), "unknown request " + std::to_string(step.request));
    }
    Live& r = it->second;
    const std::string name = "request " + std::to_string(step.request);
    const RequestLifecycle::Phase phase = lifecycle.phase(step.request);
    if (phase == RequestLifecycle::Phase::kFinished) {
      fail(ErrorId::kJsonValue, join_key(p, "request"),
           name + " finished at steps[" + std::to_string(r.finished_at) + "]");
    }
    std::int64_t prefix_positions = 0;
    if (phase == RequestLifecycle::Phase::kIdle) {
      // A request starts at its first step and takes its state, which must be free.
      if (const auto h = lifecycle.holder(r.state)) {
        fail(ErrorId::kJsonValue, join_key(p, "request"),
             name + " starts on state " + std::to_string(r.state) + ", still held by active request " +
                 std::to_string(*h));
      }
      prefix_positions = check_prefix(s, step.request, lifecycle, i);
    }
    const bool writes = step_kind_writes_rows(step.kind);
    if (step_kind_fields(step.kind) == StepFields::kRowsOrder) {
      check_count(step.rows, 1, kMaxPrefillRows, join_key(p, "rows"), "prefill rows");
    }
    if (step_kind_fields(step.kind) == StepFields::kDrafts) {
      check_count(step.drafts, 0, kMaxDrafts, join_key(p, "drafts"), "drafts");
    }
    // How the step changes the request: scenarios/step_semantics.hpp, the one place.
    // (A request's first step begins it, at its shared prefix's length.)
    const std::int64_t first = phase == RequestLifecycle::Phase::kIdle
                                   ? prefix_positions
                                   : step_first_position(lifecycle.progress(step.request));
    switch (lifecycle.step(step.request, r.state, step, prefix_positions)) {
      case StepRefusal::kNone: break;
      case StepRefusal::kWriteWhileVerifyPending:
        fail(ErrorId::kJsonValue, join_key(p, "kind"),
             std::string(step_kind_name(step.kind)) + " while the verify at steps[" +
                 std::to_string(*r.verify_at) + "] of " + name + " awaits its accept");
      case StepRefusal::kAcceptWithoutVerify:
        fail(ErrorId::kJsonValue, join_key(p, "kind"), "accept without a pending verify of " + name);
      case StepRefusal::kAcceptNegative:
        fail(ErrorId::kJsonValue, join_key(p, "accepted"),
             "accept " + std::to_string(step.accepted) + " is negative");
      case StepRefusal::kAcceptTooMany:
        fail(ErrorId::kJsonValue, join_key(p, "accepted"),
             "accept " + std::to_string(step.accepted) + " exceeds the " +
                 std::to_string(s.steps[*r.verify_at].drafts) + " drafts of the pending verify at steps[" +
                 std::to_string(*r.verify_at) + "]");
      case StepRefusal::kBadRows:
        fail(ErrorId::kJsonValue, p, "prefill rows must be >= 1 and verify drafts >= 0");
      case StepRefusal::kTrimNone:
        fail(ErrorId::kJsonValue, join_key(p, "positions"),
             "trim " + std::to_string(step.positions) + " removes no position (at least 1)");
      case StepRefusal::kTrimTooMany:
        fail(ErrorId::kJsonValue, join_key(p, "positions"),
             "trim " + std::to_string(step.positions) + " exceeds the " + std::to_string(first) +
                 " committed positions of " + name);
    }
    sim.first_position.push_back(writes ? first : 0);
    if (writes) {
      const std::int64_t rows = step_rows(step);
      r.written += rows;
      if (r.written >= kMaxRows) {
        fail(ErrorId::kSize, p, name + " writes 2^40 rows or more over the schedule");
      }
      auto& end = sim.written_end[step.request];
      end = std::max(end, first + rows);
    }
    // The pending verify named in messages: only a writing step (a verify)
    // leaves drafts pending, and every other step that passes clears them.
    if (!lifecycle.progress(step.request).pending()) {
      r.verify_at.reset();
    } else if (writes) {
      r.verify_at = i;
    }
    if (step_kind_ends_request(step.kind)) r.finished_at = i;
  }
  return sim;
}

void validate_data(const Scenario& s, const Simulation& sim) {
  const CacheConfig& c = s.cache;
  const auto kv_width = static_cast<std::size_t>(c.kv_heads) * static_cast<std::size_t>(c.head_dim);
  const auto q_width = static_cast<std::size_t>(c.q_heads) * static_cast<std::size_t>(c.head_dim);
  // (layer, request, position, step): an unstepped row is its own key, so it
  // may stand beside rows for particular steps of the same position.
  std::map<std::tuple<std::int32_t, std::int64_t, std::int64_t, std::optional<std::int64_t>>, std::size_t>
      seen;
  for (std::size_t i = 0; i < s.data.rows.size(); ++i) {
    const ExplicitRow& row = s.data.rows[i];
    const std::string p = join_index("data.rows", i);
    if (row.layer < 0 || row.layer >= c.layers) {
      fail(ErrorId::kJsonValue, join_key(p, "layer"),
           "layer " + std::to_string(row.layer) + " is outside 0.." + std::to_string(c.layers - 1));
    }
    const bool known = std::any_of(s.requests.begin(), s.requests.end(),
                                   [&](const Request& r) { return r.id == row.request; });
    if (!known) {
      fail(ErrorId::kJsonValue, join_key(p, "request"), "unknown request " + std::to_string(row.request));
    }
    const auto end = sim.written_end.find(row.request);
    const std::int64_t written = end == sim.written_end.end() ? 0 : end->second;
    if (row.position < 0 || row.position >= written) {
      fail(ErrorId::kJsonValue, join_key(p, "position"),
           "position " + std::to_string(row.position) + " is never written by request " +
               std::to_string(row.request) + " (positions 0.." + std::to_string(written - 1) + ")");
    }
    if (row.step) {
      const std::string sp = join_key(p, "step");
      const std::int64_t index = *row.step;
      const auto count = static_cast<std::int64_t>(s.steps.size());
      if (index < 0 || index >= count) {
        fail(ErrorId::kJsonValue, sp,
             "step " + std::to_string(index) +
                 (count == 0 ? std::string(", but the scenario has no steps")
                             : " is outside 0.." + std::to_string(count - 1)));
      }
      const Step& step = s.steps[static_cast<std::size_t>(index)];
      const std::string at = "steps[" + std::to_string(index) + "]";
      if (step_rows(step) == 0) {
        fail(ErrorId::kJsonValue, sp,
             at + (std::string_view("aeiou").find(step_kind_name(step.kind)[0]) != std::string_view::npos
                       ? " is an "
                       : " is a ") +
                 std::string(step_kind_name(step.kind)) + " step, which writes no row");
      }
      if (step.request != row.request) {
        fail(ErrorId::kJsonValue, sp,
             at + " writes request " + std::to_string(step.request) + ", not request " +
                 std::to_string(row.request));
      }
      const std::int64_t first = sim.first_position[static_cast<std::size_t>(index)];
      const std::int64_t last = first + step_rows(step) - 1;
      if (row.position < first || row.position > last) {
        fail(ErrorId::kJsonValue, sp,
             at + " writes positions " + std::to_string(first) + ".." + std::to_string(last) +
                 ", not position " + std::to_string(row.position));
      }
    }
    const auto [prior, inserted] =
        seen.emplace(std::tuple(row.layer, row.request, row.position, row.step), i);
    if (!inserted) {
      fail(ErrorId::kJsonValue, p,
           std::string(row.step ? "duplicate row for this layer, request, position and step"
                                : "duplicate row for this layer, request and position") +
               " (first at data.rows[" + std::to_string(prior->second) + "])");
    }
    const auto check_width = [&](const std::vector<double>& values, std::size_t width, std::string_view key,
                                 std::string_view rule) {
      const std::string vp = join_key(p, key);
      if (values.size() != width) {
        fail(ErrorId::kJsonValue, vp,
             "has " + std::to_string(values.size()) + " values, expected " + std::string(rule) + " = " +
                 std::to_string(width));
      }
      for (std::size_t e = 0; e < values.size(); ++e) check_real(values[e], join_index(vp, e));
    };
    check_width(row.k, kv_width, "k", "kv_heads*head_dim");
    if (c.shared_row) {
      check_width(row.v, 0, "v", "0 for a shared row");
    } else {
      check_width(row.v, kv_width, "v", "kv_heads*head_dim");
    }
    check_width(row.q, q_width, "q", "q_heads*head_dim");
  }
}

void validate_expect(const Scenario& s, const Simulation& sim) {
  if (!s.expect) return;
  const Expectations& e = *s.expect;
  // Counts are per query, over every layer: the widest layer window bounds them.
  std::int64_t keys = window_keys(s.cache);
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(s.cache.layer_windows.size()); ++l)
    keys = std::max(keys, layer_window_keys(s.cache, l));
  std::set<std::int64_t> seen;
  for (std::size_t i = 0; i < e.overwritten.size(); ++i) {
    const OverwriteExpectation& o = e.overwritten[i];
    const std::string p = join_index("expect.overwritten", i);
    if (o.step < 0 || o.step >= static_cast<std::int64_t>(s.steps.size())) {
      fail(ErrorId::kJsonValue, join_key(p, "step"),
           "step " + std::to_string(o.step) + " is outside 0.." +
               std::to_string(static_cast<std::int64_t>(s.steps.size()) - 1));
    }
    const Step& step = s.steps[static_cast<std::size_t>(o.step)];
    if (step_rows(step) == 0) {
      fail(ErrorId::kJsonValue, join_key(p, "step"),
           "steps[" + std::to_string(o.step) + "] is a " + std::string(step_kind_name(step.kind)) +
               " step, which runs no query");
    }
    if (!seen.insert(o.step).second) {
      fail(ErrorId::kJsonValue, join_key(p, "step"),
           "a second expectation for steps[" + std::to_string(o.step) + "]");
    }
    const std::string cp = join_key(p, "counts");
    if (static_cast<std::int64_t>(o.counts.size()) != step_rows(step)) {
      fail(ErrorId::kJsonValue, cp,
           "has " + std::to_string(o.counts.size()) + " counts, but steps[" + std::to_string(o.step) +
               "] runs " + std::to_string(step_rows(step)) + " queries");
    }
    const std::int64_t first = sim.first_position[static_cast<std::size_t>(o.step)];
    for (std::size_t q = 0; q < o.counts.size(); ++q) {
      const std::int64_t position = first + static_cast<std::int64_t>(q);
      const std::int64_t visible = std::min(position + 1, keys);
      if (o.counts[q] < 0 || o.counts[q] > visible) {
        fail(ErrorId::kJsonValue, join_index(cp, q),
             "count " + std::to_string(o.counts[q]) + " is outside 0.." + std::to_string(visible) +
                 " (rows visible to the query at position " + std::to_string(position) + ")");
      }
    }
  }
  if (e.collisions && *e.collisions < 0) {
    fail(ErrorId::kJsonValue, "expect.collisions",
         "collisions " + std::to_string(*e.collisions) + " is negative");
  }
  if (e.output_tolerance) {
    check_real(*e.output_tolerance, "expect.output_tolerance");
    if (*e.output_tolerance < 0) {
      fail(ErrorId::kJsonValue, "expect.output_tolerance", "output_tolerance is negative");
    }
  }
}

}  // namespace

void validate_scenario(const Scenario& s) {
  if (s.name.empty()) fail(ErrorId::kJsonValue, "name", "name is empty");
  if (s.name.size() > 200) fail(ErrorId::kJsonValue, "name", "name is longer than 200 bytes");
  for (const char ch : s.name) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7F) fail(ErrorId::kJsonValue, "name", "name contains a control character");
  }
  if (!valid_utf8(s.name)) fail(ErrorId::kJsonValue, "name", "name is not valid UTF-8");
  if (!valid_utf8(s.description)) {
    fail(ErrorId::kJsonValue, "description", "description is not valid UTF-8");
  }
  validate_cache(s.cache);
  const Simulation sim = simulate(s);
  validate_data(s, sim);
  validate_expect(s, sim);
}

}  // namespace kvcheck::scenarios
