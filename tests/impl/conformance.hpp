// The backend conformance suite, written once and run over every backend
// (ggml's test-backend-ops pattern). A Harness drives a RingPool on a named
// backend through docs/semantics.md "Steps" steps with PRNG rows and checks every step against
// independent references:
//   * tags and slots: model::SlotOracle / expand_index (model/address.hpp)
//     predict every write (slot, new tag, replaced tag) and every index
//     column; every visible row read must carry the tag of its latest write;
//   * outputs: model::attend_heads in model::Real over the visible rows,
//     rotated with model::rope_rotate and rounded through the element format
//     (format_round_trip), within a kernel tolerance; and against the exact
//     rows within a quantization tolerance;
//   * logical length after every step (the harness keeps its own).
// Checks record failures instead of stopping, so the fault tests can run a
// faulty pool through the same schedule and require that something failed.
//
// A backend test file includes this header and expands
// KVCHECK_CONFORMANCE_SUITE("cpu") (or "cuda"); an unavailable backend turns
// every case into a warning and a pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "impl/kv_cache.hpp"
#include "impl/ring_pool.hpp"
#include "model/address.hpp"
#include "model/attention.hpp"
#include "model/real.hpp"
#include "support/prng.hpp"

namespace kvcheck::conformance {

using impl::ElementFormat;
using impl::Fault;
using impl::PoolSpec;
using impl::PrefillOrder;
using impl::RingPool;
using impl::RopeStyle;
using impl::StepResult;
using impl::StepRows;
using model::Real;

/// Kernel tolerance per output element, from the element format: f64 pools
/// accumulate in double, the others in float over `width` rows.
inline double kernel_tolerance(ElementFormat f, std::int64_t width, double magnitude) {
  const double unit = f == ElementFormat::kF64 ? 0x1.0p-53 : 0x1.0p-24;
  return 64.0 * unit * static_cast<double>(width + 8) * (1.0 + magnitude);
}

/// Quantization tolerance: one element-format rounding of every row element.
inline double quantization_tolerance(ElementFormat f, double magnitude) {
  return 2.0 * format_unit_roundoff(f) * (1.0 + magnitude);
}

/// Makes a backend or returns nullptr (with a Catch warning) when unavailable.
inline std::unique_ptr<impl::KvBackend> backend_or_skip(const std::string& name) {
  std::string why;
  auto b = impl::make_backend(name, &why);
  if (!b) WARN("backend " << name << " unavailable: " << why);
  return b;
}

/// Exact rows of one position as given to the pool.
struct ExactRows {
  std::vector<double> k, v;  // [kv_heads * head_dim]
};

/// Drives one RingPool and checks it against the model.
class Harness {
 public:
  /// `spec` is what the pool is asked for; the oracle uses it fault-free.
  Harness(const std::string& backend, const PoolSpec& spec, std::uint64_t seed)
      : spec_(spec), prng_(seed), oracle_(model::Ring{spec.states, spec.ring_rows, spec.window_keys}) {
    auto b = impl::make_backend(backend, nullptr);
    if (!b) {
      fail("backend unavailable");
      return;
    }
    const auto st = RingPool::create(std::move(b), spec, &pool_);
    if (!st.ok()) fail("create: " + st.detail);
    states_.resize(static_cast<std::size_t>(spec.states));
  }

  bool ready() const { return pool_ != nullptr; }
  RingPool& pool() { return *pool_; }
  const std::vector<std::string>& failures() const { return failures_; }
  /// All failures joined, for Catch messages.
  std::string report() const {
    std::ostringstream os;
    for (std::size_t i = 0; i < failures_.size() && i < 12; ++i) os << failures_[i] << "\n";
    if (failures_.size() > 12) os << "... " << failures_.size() << " failures\n";
    return os.str();
  }
  /// Largest output difference to the reference seen so far.
  double max_kernel_error() const { return max_err_; }

  void begin(std::int64_t state, std::int64_t request) {
    if (!ready()) return;
    const auto st = pool_->begin(state, request);
    if (!st.ok()) return fail("begin: " + st.detail);
    states_[idx(state)] = Expect{true, request, 0, -1};
  }

  void prefill(std::int64_t state, std::int64_t n, PrefillOrder order) {
    step(state, n, -1, order, "prefill");
  }
  void decode(std::int64_t state) { step(state, 1, -1, PrefillOrder::kStoreThenLoad, "decode"); }
  void verify(std::int64_t state, std::int64_t drafts) {
    step(state, drafts + 1, drafts, PrefillOrder::kStoreThenLoad, "verify");
  }

  // The suite's own length bookkeeping, independent of scenarios/step_semantics.hpp on purpose.
  void accept(std::int64_t state, std::int64_t accepted) {
    if (!ready()) return;
    const auto st = pool_->accept(state, accepted);
    if (!st.ok()) return fail("accept: " + st.detail);
    auto& e = states_[idx(state)];
    e.length = e.length - e.pending - 1 + 1 + accepted;
    e.pending = -1;
    check_length(state, "accept");
  }

  void finish(std::int64_t state) {
    if (!ready()) return;
    const auto st = pool_->finish(state);
    if (!st.ok()) return fail("finish: " + st.detail);
    states_[idx(state)].busy = false;
  }

  void reset(std::int64_t state) {
    if (!ready()) return;
    const auto st = pool_->reset(state);
    if (!st.ok()) return fail("reset: " + st.detail);
    states_[idx(state)].length = 0;
    states_[idx(state)].pending = -1;
    check_length(state, "reset");
  }

 private:
  struct Expect {
    bool busy = false;
    std::int64_t request = -1;
    std::int64_t length = 0;
    std::int64_t pending = -1;
  };

  static std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

  void fail(const std::string& what) { failures_.push_back(what); }

  std::int64_t kv_elements() const { return std::int64_t{spec_.kv_heads} * spec_.head_dim; }
  std::int64_t q_elements() const { return std::int64_t{spec_.q_heads} * spec_.head_dim; }

  void check_length(std::int64_t state, const char* what) {
    const auto& info = pool_->state(state);
    const auto& e = states_[idx(state)];
    if (info.length != e.length) {
      fail(std::string(what) + ": state " + std::to_string(state) + " length " + std::to_string(info.length) +
           ", expected " + std::to_string(e.length));
    }
  }

  model::Rope rope() const {
    model::Rope r;
    r.style = spec_.rope_style == RopeStyle::kNeox          ? model::RopeStyle::kNeox
              : spec_.rope_style == RopeStyle::kInterleaved ? model::RopeStyle::kInterleaved
                                                            : model::RopeStyle::kNone;
    r.rotary_dims = spec_.rope_dims;
    r.base = spec_.rope_base;
    return r;
  }

  /// Rotates every head of a flattened row at `position` in Real.
  std::vector<Real> rotate_row(const std::vector<double>& row, std::int64_t position) const {
    std::vector<Real> out;
    const auto heads = static_cast<std::int32_t>(row.size() / static_cast<std::size_t>(spec_.head_dim));
    for (std::int32_t h = 0; h < heads; ++h) {
      model::Row<Real> head;
      for (std::int32_t d = 0; d < spec_.head_dim; ++d) head.emplace_back(row[idx(h * spec_.head_dim + d)]);
      model::rope_rotate(head, position, rope());
      out.insert(out.end(), head.begin(), head.end());
    }
    return out;
  }

  /// Rounds a Real row to double, then through the element format.
  std::vector<Real> stored(const std::vector<Real>& row) const {
    std::vector<double> d(row.size()), r(row.size());
    for (std::size_t i = 0; i < row.size(); ++i) d[i] = model::to_double(row[i]);
    impl::format_round_trip(spec_.format, d.data(), r.data(), static_cast<std::int64_t>(d.size()));
    return std::vector<Real>(r.begin(), r.end());
  }

  void step(std::int64_t state, std::int64_t n, std::int64_t drafts, PrefillOrder order, const char* what) {
    if (!ready()) return;
    auto& e = states_[idx(state)];
    const std::int64_t first = e.length;
    // Random rows: multiples of 2^-20 in [-1, 1), scaled up a little so the
    // softmax is not flat.
    std::vector<double> k(static_cast<std::size_t>(n * kv_elements()));
    std::vector<double> v(k.size());
    std::vector<double> q(static_cast<std::size_t>(n * q_elements()));
    for (auto& x : k) x = 2.0 * prng_.signed_unit();
    for (auto& x : v) x = prng_.signed_unit();
    for (auto& x : q) x = 2.0 * prng_.signed_unit();
    StepRows in{k.data(), spec_.shared_row ? nullptr : v.data(), q.data()};
    StepResult result;
    impl::Status st;
    if (drafts >= 0) {
      st = pool_->verify(state, drafts, in, &result);
    } else if (n == 1 && std::string(what) == "decode") {
      st = pool_->decode(state, in, &result);
    } else {
      st = pool_->prefill(state, n, in, order, &result);
    }
    if (!st.ok()) return fail(std::string(what) + ": " + st.detail);

    // The model's view: rows and writes.
    const model::Ring& ring = oracle_.ring();
    std::vector<model::SlotTag> written;
    std::vector<model::SlotTag> replaced;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t p = first + i;
      ExactRows rows;
      rows.k.assign(k.begin() + i * kv_elements(), k.begin() + (i + 1) * kv_elements());
      if (spec_.shared_row) {
        rows.v = rows.k;
      } else {
        rows.v.assign(v.begin() + i * kv_elements(), v.begin() + (i + 1) * kv_elements());
      }
      rows_[{e.request, p}] = std::move(rows);
      replaced.push_back(oracle_.write(state, e.request, p));
      written.push_back(oracle_.at(model::slot_of(state, p, ring.ring_rows)));
      latest_[{e.request, p}] = written.back();
    }
    e.length = first + n;
    if (drafts >= 0) e.pending = drafts;
    check_length(state, what);

    const std::string where = std::string(what) + " at " + std::to_string(first) + "+" + std::to_string(n);
    if (spec_.track_tags) {
      if (static_cast<std::int64_t>(result.writes.size()) != n) {
        fail(where + ": " + std::to_string(result.writes.size()) + " write records");
      } else {
        const auto slots = model::write_slots(state, first, n, ring);
        for (std::int64_t i = 0; i < n; ++i) {
          const auto& w = result.writes[idx(i)];
          const auto& ow = written[idx(i)];
          const auto& orp = replaced[idx(i)];
          if (w.slot != slots[idx(i)] || w.written.request != ow.request ||
              w.written.position != ow.position || w.written.write_seq != ow.write_seq ||
              w.replaced.request != orp.request || w.replaced.position != orp.position ||
              w.replaced.write_seq != orp.write_seq) {
            fail(where + ": write " + std::to_string(i) + " slot " + std::to_string(w.slot) + " (expected " +
                 std::to_string(slots[idx(i)]) + ") tag/replaced differ from the oracle");
          }
        }
      }
    }
    if (result.queries != n || result.width != spec_.window_keys) {
      fail(where + ": result has " + std::to_string(result.queries) + " queries of width " +
           std::to_string(result.width) + ", expected width " + std::to_string(spec_.window_keys));
    }
    const auto width = result.width;
    for (std::int64_t i = 0; i < n && i < result.queries; ++i) {
      const std::int64_t p = first + i;
      const auto expected_index = model::expand_index(state, p, ring, spec_.window_keys);
      const model::DecodeMeta meta = model::decode_meta(state, p, ring);
      if (spec_.track_tags && result.read_slots.size() >= static_cast<std::size_t>((i + 1) * width)) {
        for (std::int64_t c = 0; c < std::max<std::int64_t>(width, spec_.window_keys); ++c) {
          const std::int64_t got = c < width ? result.read_slots[idx(i * width + c)] : -1;
          const std::int64_t want = c < spec_.window_keys ? expected_index[idx(c)] : -1;
          if (got != want) {
            fail(where + ": query " + std::to_string(p) + " column " + std::to_string(c) + " read slot " +
                 std::to_string(got) + ", expected " + std::to_string(want));
            break;
          }
          if (c < meta.length && c < width) {
            const std::int64_t j = meta.start + c;
            const impl::Tag& t = result.read_tags[idx(i * width + c)];
            const model::SlotTag& l = latest_[{e.request, j}];
            if (t.request != l.request || t.position != l.position || t.write_seq != l.write_seq) {
              fail(where + ": query " + std::to_string(p) + " read position " + std::to_string(j) +
                   " with tag (" + std::to_string(t.request) + "," + std::to_string(t.position) + "," +
                   std::to_string(t.write_seq) + "), expected its latest write (" +
                   std::to_string(l.request) + "," + std::to_string(l.position) + "," +
                   std::to_string(l.write_seq) + ")");
              break;
            }
          }
        }
      }
      check_output(where, p, q.data() + i * q_elements(), result.out.data() + i * q_elements(), e.request);
    }
  }

  void check_output(const std::string& where, std::int64_t p, const double* q, const double* out,
                    std::int64_t request) {
    const std::int64_t first = std::max<std::int64_t>(0, p - spec_.window_keys + 1);
    std::vector<model::Projected<Real>> rows, exact;
    double magnitude = 0;
    for (std::int64_t j = first; j <= p; ++j) {
      const ExactRows& r = rows_.at({request, j});
      const auto k_rot = rotate_row(r.k, j);
      model::Projected<Real> pr, ex;
      ex.k = k_rot;
      pr.k = stored(k_rot);
      if (!spec_.shared_row) {
        ex.v = std::vector<Real>(r.v.begin(), r.v.end());
        std::vector<Real> vr(r.v.begin(), r.v.end());
        pr.v = stored(vr);
      }
      for (double x : r.v) magnitude = std::max(magnitude, std::fabs(x));
      for (double x : r.k) magnitude = std::max(magnitude, std::fabs(x));
      rows.push_back(std::move(pr));
      exact.push_back(std::move(ex));
    }
    std::vector<const model::Projected<Real>*> ptrs, exact_ptrs;
    for (auto& r : rows) ptrs.push_back(&r);
    for (auto& r : exact) exact_ptrs.push_back(&r);
    std::vector<double> qd(q, q + q_elements());
    const auto q_rot = rotate_row(qd, p);
    const model::Heads heads{spec_.q_heads, spec_.kv_heads, spec_.head_dim, spec_.shared_row};
    const Real scale =
        spec_.softmax_scale > 0 ? Real(spec_.softmax_scale) : Real(1) / sqrt(Real(spec_.head_dim));
    std::optional<Real> sink;
    if (spec_.has_sink) sink = Real(spec_.sink_logit);
    const auto ref = model::attend_heads(q_rot, ptrs, heads, scale, sink);
    const auto ref_exact = model::attend_heads(q_rot, exact_ptrs, heads, scale, sink);
    const double tol = kernel_tolerance(spec_.format, spec_.window_keys, magnitude);
    const double qtol = tol + quantization_tolerance(spec_.format, magnitude) * 8.0;
    for (std::int64_t x = 0; x < q_elements(); ++x) {
      const double r = model::to_double(ref[idx(x)]);
      const double err = std::fabs(out[x] - r);
      max_err_ = std::max(max_err_, err);
      if (!(err <= tol)) {
        fail(where + ": query " + std::to_string(p) + " output " + std::to_string(x) + " = " +
             std::to_string(out[x]) + ", reference " + std::to_string(r) + " (tolerance " +
             std::to_string(tol) + ")");
        return;
      }
      const double qerr = std::fabs(out[x] - model::to_double(ref_exact[idx(x)]));
      if (!(qerr <= qtol)) {
        fail(where + ": query " + std::to_string(p) + " quantization error " + std::to_string(qerr));
        return;
      }
    }
  }

  PoolSpec spec_;
  Prng prng_;
  model::SlotOracle oracle_;
  std::unique_ptr<RingPool> pool_;
  std::vector<Expect> states_;
  std::map<std::pair<std::int64_t, std::int64_t>, ExactRows> rows_;
  std::map<std::pair<std::int64_t, std::int64_t>, model::SlotTag> latest_;
  std::vector<std::string> failures_;
  double max_err_ = 0;
};

/// A small spec: W = 5, S = W + k for verify(2) and load-first chunks.
inline PoolSpec small_spec(ElementFormat f, std::int32_t q_heads, std::int32_t kv_heads, bool shared) {
  PoolSpec s;
  s.states = 3;
  s.window_keys = 5;
  s.ring_rows = 8;  // >= max(W + k, W + C - 1) for k = 2 drafts, store-first chunks of 4
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.head_dim = 6;
  s.shared_row = shared;
  s.format = f;
  s.rope_style = RopeStyle::kNeox;
  s.rope_dims = 4;
  s.rope_base = 100.0;
  s.max_step_rows = 7;
  return s;
}

/// Every step kind on two states, with ring wraps, verify with rejection,
/// chunks longer than the window in both orders, finish and reuse, reset.
inline void run_all_steps(Harness& h) {
  h.begin(2, 10);
  h.begin(1, 11);
  h.prefill(2, 3, PrefillOrder::kStoreThenLoad);  // positions 0..2 (< W: -1 padding)
  h.decode(2);                                    // 3
  h.prefill(1, 7, PrefillOrder::kLoadThenStore);  // chunk longer than the window
  h.prefill(2, 4, PrefillOrder::kStoreThenLoad);  // 4..7
  h.verify(2, 2);                                 // 8..10
  h.accept(2, 1);                                 // length 10
  for (int i = 0; i < 6; ++i) h.decode(2);        // 10..15: wraps the ring
  h.prefill(2, 6, PrefillOrder::kLoadThenStore);  // 16..21
  h.verify(1, 2);                                 // 7..9
  h.accept(1, 0);                                 // length 8
  h.decode(1);
  h.verify(2, 2);
  h.accept(2, 2);
  h.prefill(1, 3, PrefillOrder::kLoadThenStore);
  h.finish(2);
  h.begin(2, 12);  // reuse: stale rows of request 10
  h.decode(2);
  h.decode(2);
  h.prefill(2, 2, PrefillOrder::kStoreThenLoad);
  h.reset(1);
  h.prefill(1, 4, PrefillOrder::kLoadThenStore);
  for (int i = 0; i < 9; ++i) h.decode(1);
}

/// Snapshot of everything observable in a pool: every slot's dequantized rows
/// and tag, and every state's logical state.
struct PoolSnapshot {
  std::vector<double> rows;
  std::vector<impl::Tag> tags;
  std::vector<impl::StateInfo> states;
  bool operator==(const PoolSnapshot& o) const {
    if (rows.size() != o.rows.size() || tags != o.tags || states.size() != o.states.size()) return false;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      // Bitwise, so -0.0 vs 0.0 and NaNs would be told apart.
      if (std::memcmp(&rows[i], &o.rows[i], sizeof(double)) != 0) return false;
    }
    for (std::size_t i = 0; i < states.size(); ++i) {
      const auto& a = states[i];
      const auto& b = o.states[i];
      if (a.busy != b.busy || a.request != b.request || a.length != b.length ||
          a.pending_drafts != b.pending_drafts) {
        return false;
      }
    }
    return true;
  }
};

inline PoolSnapshot snapshot(RingPool& pool) {
  PoolSnapshot s;
  const auto& spec = pool.spec();
  const std::int64_t n = std::int64_t{spec.kv_heads} * spec.head_dim;
  std::vector<double> k(static_cast<std::size_t>(n)), v(k.size());
  for (std::int64_t slot = 0; slot < spec.states * spec.ring_rows; ++slot) {
    REQUIRE(pool.backend().read_row(slot, k.data(), v.data()).ok());
    s.rows.insert(s.rows.end(), k.begin(), k.end());
    s.rows.insert(s.rows.end(), v.begin(), v.end());
    s.tags.push_back(pool.backend().slot_tag(slot));
  }
  for (std::int64_t b = 0; b < spec.states; ++b) s.states.push_back(pool.state(b));
  return s;
}

}  // namespace kvcheck::conformance

// The suite. NAME is a backend name string literal ("cpu", "cuda").
#define KVCHECK_CONFORMANCE_SUITE(NAME)                                                                      \
  TEST_CASE(NAME " conformance: every step kind matches the model in every format and layout",               \
            "[conformance]") {                                                                               \
    using namespace kvcheck::conformance;                                                                    \
    if (!backend_or_skip(NAME)) return;                                                                      \
    struct Layout {                                                                                          \
      const char* name;                                                                                      \
      std::int32_t q, kv;                                                                                    \
      bool shared;                                                                                           \
    };                                                                                                       \
    const Layout layouts[] = {                                                                               \
        {"mha", 2, 2, false}, {"gqa", 4, 2, false}, {"mqa", 3, 1, false}, {"shared-row", 2, 1, true}};       \
    const ElementFormat formats[] = {ElementFormat::kF64, ElementFormat::kF32, ElementFormat::kBf16,         \
                                     ElementFormat::kFp8};                                                   \
    std::uint64_t seed = 1;                                                                                  \
    for (const auto& l : layouts) {                                                                          \
      for (const auto f : formats) {                                                                         \
        for (const bool track : {true, false}) {                                                             \
          PoolSpec spec = small_spec(f, l.q, l.kv, l.shared);                                                \
          spec.track_tags = track;                                                                           \
          if (l.shared) spec.rope_style = kvcheck::impl::RopeStyle::kInterleaved;                            \
          if (f == ElementFormat::kBf16) {                                                                   \
            spec.has_sink = true;                                                                            \
            spec.sink_logit = 0.5;                                                                           \
          }                                                                                                  \
          Harness h(NAME, spec, ++seed);                                                                     \
          run_all_steps(h);                                                                                  \
          INFO("layout " << l.name << " format " << kvcheck::format_name(f) << " tags " << track << "\n"     \
                         << h.report());                                                                     \
          CHECK(h.failures().empty());                                                                       \
          /* float kernels differ from the Real reference: proves outputs were compared */                   \
          if (f != ElementFormat::kF64) CHECK(h.max_kernel_error() > 0);                                     \
        }                                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
  }                                                                                                          \
                                                                                                             \
  TEST_CASE(NAME " conformance: outputs do not depend on tag tracking", "[conformance]") {                   \
    using namespace kvcheck::conformance;                                                                    \
    if (!backend_or_skip(NAME)) return;                                                                      \
    for (const auto f : {ElementFormat::kF32, ElementFormat::kFp8}) {                                        \
      std::vector<double> outs[2];                                                                           \
      for (int track = 0; track < 2; ++track) {                                                              \
        PoolSpec spec = small_spec(f, 4, 2, false);                                                          \
        spec.track_tags = track == 1;                                                                        \
        std::unique_ptr<RingPool> pool;                                                                      \
        REQUIRE(RingPool::create(kvcheck::impl::make_backend(NAME, nullptr), spec, &pool).ok());             \
        REQUIRE(pool->begin(0, 1).ok());                                                                     \
        kvcheck::Prng prng(99);                                                                              \
        for (int step = 0; step < 12; ++step) {                                                              \
          std::vector<double> k(12), v(12), q(24);                                                           \
          for (auto& x : k) x = prng.signed_unit();                                                          \
          for (auto& x : v) x = prng.signed_unit();                                                          \
          for (auto& x : q) x = prng.signed_unit();                                                          \
          StepResult r;                                                                                      \
          REQUIRE(pool->decode(0, StepRows{k.data(), v.data(), q.data()}, &r).ok());                         \
          outs[track].insert(outs[track].end(), r.out.begin(), r.out.end());                                 \
          if (track == 0) CHECK(r.read_tags.empty());                                                        \
        }                                                                                                    \
      }                                                                                                      \
      CHECK(outs[0] == outs[1]);                                                                             \
    }                                                                                                        \
  }                                                                                                          \
                                                                                                             \
  TEST_CASE(NAME " conformance: each named fault is caught by the conformance checks",                       \
            "[conformance][faults]") {                                                                       \
    using namespace kvcheck::conformance;                                                                    \
    if (!backend_or_skip(NAME)) return;                                                                      \
    for (int i = 0; i < kvcheck::impl::kFaultCount; ++i) {                                                   \
      const auto fault = static_cast<Fault>(i);                                                              \
      PoolSpec spec = small_spec(ElementFormat::kF64, 2, 1, false);                                          \
      spec.fault = fault;                                                                                    \
      Harness h(NAME, spec, 7);                                                                              \
      REQUIRE(h.ready());                                                                                    \
      run_all_steps(h);                                                                                      \
      INFO("fault " << kvcheck::impl::fault_name(fault) << "\n" << h.report());                              \
      if (fault == Fault::kNone) {                                                                           \
        CHECK(h.failures().empty());                                                                         \
      } else {                                                                                               \
        CHECK(!h.failures().empty());                                                                        \
      }                                                                                                      \
    }                                                                                                        \
  }                                                                                                          \
                                                                                                             \
  TEST_CASE(NAME " conformance: refused steps leave the pool byte-identical", "[conformance]") {             \
    using namespace kvcheck::conformance;                                                                    \
    using kvcheck::impl::CacheError;                                                                         \
    if (!backend_or_skip(NAME)) return;                                                                      \
    for (const auto f : {ElementFormat::kF32, ElementFormat::kFp8, ElementFormat::kBf16}) {                  \
      PoolSpec spec = small_spec(f, 2, 2, false);                                                            \
      std::unique_ptr<RingPool> pool;                                                                        \
      REQUIRE(RingPool::create(kvcheck::impl::make_backend(NAME, nullptr), spec, &pool).ok());               \
      REQUIRE(pool->begin(1, 5).ok());                                                                       \
      const std::size_t kv = 2 * 6, qn = 2 * 6;                                                              \
      std::vector<double> k(kv * 7, 0.25), v(kv * 7, -0.5), q(qn * 7, 0.125);                                \
      StepResult r;                                                                                          \
      REQUIRE(pool->prefill(1, 6, StepRows{k.data(), v.data(), q.data()}, PrefillOrder::kStoreThenLoad, &r)  \
                  .ok());                                                                                    \
      const PoolSnapshot before = snapshot(*pool);                                                           \
      auto expect_refused = [&](kvcheck::impl::Status st, CacheError code, const char* what) {               \
        INFO(what << ": " << st.detail);                                                                     \
        CHECK(st.code == code);                                                                              \
        CHECK(snapshot(*pool) == before);                                                                    \
      };                                                                                                     \
      StepRows good{k.data(), v.data(), q.data()};                                                           \
      expect_refused(pool->decode(3, good, &r), CacheError::kStateOutOfRange, "state 3");                    \
      expect_refused(pool->decode(-1, good, &r), CacheError::kStateOutOfRange, "state -1");                  \
      expect_refused(pool->decode(0, good, &r), CacheError::kStateFree, "free state");                       \
      expect_refused(pool->begin(1, 6), CacheError::kStateBusy, "busy state");                               \
      expect_refused(pool->prefill(1, 8, good, PrefillOrder::kLoadThenStore, &r), CacheError::kTooManyRows,  \
                     "8 rows > max_step_rows");                                                              \
      expect_refused(pool->verify(1, 7, good, &r), CacheError::kTooManyRows, "verify(7)");                   \
      expect_refused(pool->accept(1, 0), CacheError::kBadAccept, "accept without verify");                   \
      expect_refused(pool->decode(1, StepRows{k.data(), v.data(), nullptr}, &r), CacheError::kBadArgument,   \
                     "no query rows");                                                                       \
      for (auto* buf : {&k, &v, &q}) {                                                                       \
        const double keep = (*buf)[kv + 3];                                                                  \
        for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {                                             \
          (*buf)[kv + 3] = bad;                                                                              \
          expect_refused(pool->prefill(1, 3, good, PrefillOrder::kLoadThenStore, &r),                        \
                         CacheError::kNonFinite, "non-finite row element");                                  \
          expect_refused(pool->verify(1, 2, good, &r), CacheError::kNonFinite,                               \
                         "non-finite row element in verify");                                                \
        }                                                                                                    \
        (*buf)[kv + 3] = keep;                                                                               \
      }                                                                                                      \
      k[5] = 1e300; /* finite, but no float-based format holds it */                                         \
      expect_refused(pool->decode(1, good, &r), CacheError::kNonFinite, "row out of range");                 \
      k[5] = 0.25;                                                                                           \
      REQUIRE(pool->verify(1, 2, good, &r).ok());                                                            \
      const PoolSnapshot pending = snapshot(*pool);                                                          \
      CHECK(pool->decode(1, good, &r).code == CacheError::kBadAccept);                                       \
      CHECK(pool->accept(1, 3).code == CacheError::kBadAccept);                                              \
      CHECK(pool->accept(1, -1).code == CacheError::kBadAccept);                                             \
      CHECK(snapshot(*pool) == pending);                                                                     \
      CHECK(pool->accept(1, 1).ok());                                                                        \
      CHECK(pool->state(1).length == 8);                                                                     \
    }                                                                                                        \
  }                                                                                                          \
                                                                                                             \
  TEST_CASE(NAME " conformance: create refuses zero, mismatched and overflowing sizes", "[conformance]") {   \
    using namespace kvcheck::conformance;                                                                    \
    using kvcheck::impl::CacheError;                                                                         \
    if (!backend_or_skip(NAME)) return;                                                                      \
    auto code = [](PoolSpec s) {                                                                             \
      std::unique_ptr<RingPool> pool;                                                                        \
      const auto st = RingPool::create(kvcheck::impl::make_backend(NAME, nullptr), s, &pool);                \
      CHECK((pool == nullptr) == !st.ok());                                                                  \
      /* One validator: the backend alone refuses with the same code. */                                     \
      CHECK(kvcheck::impl::make_backend(NAME, nullptr)->configure(s).code == st.code);                       \
      CHECK(kvcheck::impl::validate_pool_spec(s).code == st.code);                                           \
      return st.code;                                                                                        \
    };                                                                                                       \
    const PoolSpec base = small_spec(ElementFormat::kF32, 4, 2, false);                                      \
    CHECK(code(base) == CacheError::kOk);                                                                    \
    PoolSpec s = base;                                                                                       \
    s.ring_rows = 0;                                                                                         \
    CHECK(code(s) == CacheError::kZeroRing);                                                                 \
    s = base;                                                                                                \
    s.states = 0;                                                                                            \
    CHECK(code(s) == CacheError::kZeroRing);                                                                 \
    s = base;                                                                                                \
    s.head_dim = 0;                                                                                          \
    CHECK(code(s) == CacheError::kZeroShape);                                                                \
    s = base;                                                                                                \
    s.window_keys = 0;                                                                                       \
    CHECK(code(s) == CacheError::kZeroShape);                                                                \
    s = base;                                                                                                \
    s.q_heads = 3;                                                                                           \
    CHECK(code(s) == CacheError::kBadSpec);                                                                  \
    s = base;                                                                                                \
    s.shared_row = true;                                                                                     \
    CHECK(code(s) == CacheError::kBadSpec);                                                                  \
    s = base;                                                                                                \
    s.rope_style = kvcheck::impl::RopeStyle::kNeox;                                                          \
    s.rope_dims = 3;                                                                                         \
    CHECK(code(s) == CacheError::kBadSpec);                                                                  \
    s.rope_dims = 2;                                                                                         \
    s.rope_base = -1.0;                                                                                      \
    CHECK(code(s) == CacheError::kBadSpec);                                                                  \
    s = base;                                                                                                \
    s.softmax_scale = -0.5;                                                                                  \
    CHECK(code(s) == CacheError::kBadSpec);                                                                  \
    s.softmax_scale = std::nan("");                                                                          \
    CHECK(code(s) == CacheError::kNonFinite);                                                                \
    s = base;                                                                                                \
    s.states = std::int64_t{1} << 40;                                                                        \
    s.ring_rows = std::int64_t{1} << 30;                                                                     \
    CHECK(code(s) == CacheError::kSizeOverflow);                                                             \
    s = base;                                                                                                \
    s.states = std::int64_t{1} << 31;                                                                        \
    s.ring_rows = std::int64_t{1} << 31;                                                                     \
    s.head_dim = 1 << 20;                                                                                    \
    CHECK(code(s) == CacheError::kSizeOverflow);                                                             \
  }                                                                                                          \
                                                                                                             \
  TEST_CASE(NAME " conformance: golden verify S = 128 loses [5,4,3,2,1,0], S = 133 and 134 none",              \
            "[conformance][spec]") {                                                                         \
    using namespace kvcheck::conformance;                                                                    \
    if (!backend_or_skip(NAME)) return;                                                                      \
    for (const std::int64_t ring : {128, 133, 134}) {                                                        \
      PoolSpec spec;                                                                                         \
      spec.states = 1;                                                                                       \
      spec.window_keys = 128;                                                                                \
      spec.ring_rows = ring;                                                                                 \
      spec.head_dim = 2;                                                                                     \
      spec.max_step_rows = 300;                                                                              \
      std::unique_ptr<RingPool> pool;                                                                        \
      REQUIRE(RingPool::create(kvcheck::impl::make_backend(NAME, nullptr), spec, &pool).ok());               \
      REQUIRE(pool->begin(0, 0).ok());                                                                       \
      std::vector<double> rows(600, 0.5);                                                                    \
      StepRows in{rows.data(), rows.data(), rows.data()};                                                    \
      StepResult r;                                                                                          \
      REQUIRE(pool->prefill(0, 200, in, PrefillOrder::kLoadThenStore, &r).ok());                             \
      REQUIRE(pool->verify(0, 5, in, &r).ok());                                                              \
      std::vector<std::int64_t> lost;                                                                        \
      for (std::int64_t i = 0; i < r.queries; ++i) {                                                         \
        const std::int64_t p = r.first_position + i;                                                         \
        std::int64_t n = 0;                                                                                  \
        for (std::int64_t c = 0; c < r.width; ++c) {                                                         \
          const auto& t = r.read_tags[static_cast<std::size_t>(i * r.width + c)];                            \
          if (t.position != p - r.width + 1 + c) ++n;                                                        \
        }                                                                                                    \
        lost.push_back(n);                                                                                   \
      }                                                                                                      \
      const std::vector<std::int64_t> want = ring == 128 ? std::vector<std::int64_t>{5, 4, 3, 2, 1, 0}       \
                                                         : std::vector<std::int64_t>{0, 0, 0, 0, 0, 0};      \
      INFO("S = " << ring);                                                                                  \
      CHECK(lost == want);                                                                                   \
    }                                                                                                        \
  }                                                                                                          \
                                                                                                             \
  TEST_CASE(NAME " conformance: golden prefill W = 3, S = 5 store-then-load hazards", "[conformance][spec]") { \
    using namespace kvcheck::conformance;                                                                    \
    if (!backend_or_skip(NAME)) return;                                                                      \
    for (const auto order : {PrefillOrder::kStoreThenLoad, PrefillOrder::kLoadThenStore}) {                  \
      for (const std::int64_t chunk : {3, 4, 5}) {                                                           \
        PoolSpec spec;                                                                                       \
        spec.states = 1;                                                                                     \
        spec.window_keys = 3;                                                                                \
        spec.ring_rows = 5;                                                                                  \
        spec.head_dim = 2;                                                                                   \
        spec.max_step_rows = 8;                                                                              \
        std::unique_ptr<RingPool> pool;                                                                      \
        REQUIRE(RingPool::create(kvcheck::impl::make_backend(NAME, nullptr), spec, &pool).ok());             \
        REQUIRE(pool->begin(0, 0).ok());                                                                     \
        std::vector<double> rows(16, 0.5);                                                                   \
        StepRows in{rows.data(), rows.data(), rows.data()};                                                  \
        StepResult r;                                                                                        \
        REQUIRE(pool->prefill(0, 4, in, order, &r).ok()); /* cached prefix 0..3 */                           \
        REQUIRE(pool->prefill(0, chunk, in, order, &r).ok());                                                \
        std::vector<std::int64_t> lost_positions;                                                            \
        for (std::int64_t i = 0; i < r.queries; ++i) {                                                       \
          const std::int64_t p = r.first_position + i;                                                       \
          for (std::int64_t c = 0; c < r.width; ++c) {                                                       \
            const auto& t = r.read_tags[static_cast<std::size_t>(i * r.width + c)];                          \
            const std::int64_t j = p - r.width + 1 + c;                                                      \
            if (t.position != j &&                                                                           \
                std::find(lost_positions.begin(), lost_positions.end(), j) == lost_positions.end()) {        \
              lost_positions.push_back(j);                                                                   \
            }                                                                                                \
          }                                                                                                  \
        }                                                                                                    \
        std::sort(lost_positions.begin(), lost_positions.end());                                             \
        std::vector<std::int64_t> want;                                                                      \
        if (order == PrefillOrder::kStoreThenLoad && chunk == 4) want = {2};                                 \
        if (order == PrefillOrder::kStoreThenLoad && chunk == 5) want = {2, 3};                              \
        INFO("chunk " << chunk << " store_then_load " << (order == PrefillOrder::kStoreThenLoad));           \
        CHECK(lost_positions == want);                                                                       \
      }                                                                                                      \
    }                                                                                                        \
  }
