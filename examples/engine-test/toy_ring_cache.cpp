#include "toy_ring_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace toy {

namespace {

using kvcheck::engines::CacheSpec;
using kvcheck::engines::Refusal;
using kvcheck::engines::StepAnswer;
using kvcheck::engines::StepCall;
using kvcheck::engines::StepStatus;
using kvcheck::scenarios::StepKind;

/// One state id of one layer.
struct State {
  bool busy = false;
  std::int64_t request = -1;
  std::int64_t length = 0;           // committed positions: the next write goes here
  std::int64_t pending_first = -1;   // first position of a verify awaiting its accept
  std::int64_t pending_drafts = -1;  // its drafts, -1 when none
};

/// One layer's pool.
struct Layer {
  std::vector<State> states;
  std::vector<double> k, v;          // [slots, kv_heads * head_dim]
  std::vector<std::uint8_t> filled;  // [slots]
};

class ToyRingCache final : public kvcheck::engines::CacheUnderTest {
 public:
  ToyRingCache(const CacheSpec& spec, Bug bug)
      : spec_(spec),
        capacity_(spec.cache.ring_rows),
        modulus_(bug == Bug::kRingSizedWindow ? std::min(spec.window_keys, spec.cache.ring_rows)
                                              : spec.cache.ring_rows),
        kv_width_(std::int64_t{spec.cache.kv_heads} * spec.cache.head_dim),
        q_width_(std::int64_t{spec.cache.q_heads} * spec.cache.head_dim) {
    const auto slots = static_cast<std::size_t>(spec.cache.states * capacity_);
    layers_.resize(static_cast<std::size_t>(spec.cache.layers));
    for (Layer& l : layers_) {
      l.states.resize(static_cast<std::size_t>(spec.cache.states));
      l.k.assign(slots * static_cast<std::size_t>(kv_width_), 0.0);
      l.v.assign(slots * static_cast<std::size_t>(kv_width_), 0.0);
      l.filled.assign(slots, 0);
    }
  }

  StepStatus call(const StepCall& c, StepAnswer* answer) override {
    if (answer) answer->clear();
    if (c.layer < 0 || static_cast<std::size_t>(c.layer) >= layers_.size()) {
      return Refusal{"layer-out-of-range", "layer " + std::to_string(c.layer)};
    }
    Layer& layer = layers_[static_cast<std::size_t>(c.layer)];
    if (c.state < 0 || static_cast<std::size_t>(c.state) >= layer.states.size()) {
      return Refusal{"state-out-of-range", "state " + std::to_string(c.state)};
    }
    State& st = layer.states[static_cast<std::size_t>(c.state)];
    if (c.op == StepCall::Op::kBegin) {
      if (st.busy) return Refusal{"state-busy", "state holds request " + std::to_string(st.request)};
      st = State{true, c.step.request, 0, -1, -1};
      return {};
    }
    if (!st.busy) return Refusal{"state-free", "the state has no request"};
    if (st.request != c.step.request) return Refusal{"request-mismatch", "the state holds another request"};
    switch (c.step.kind) {
      case StepKind::kAccept:
        if (st.pending_drafts < 0) return Refusal{"bad-accept", "no verify is pending"};
        if (c.step.accepted < 0 || c.step.accepted > st.pending_drafts) {
          return Refusal{"bad-accept", "accept(" + std::to_string(c.step.accepted) + ") outside 0.." +
                                           std::to_string(st.pending_drafts)};
        }
        // The verified token and the accepted drafts are committed.
        st.length = st.pending_first + 1 + c.step.accepted;
        st.pending_first = st.pending_drafts = -1;
        return {};
      case StepKind::kTrim:
        // A pending verify is dropped first; n counts committed positions.
        if (c.step.positions < 1 || c.step.positions > st.length) {
          return Refusal{"bad-trim", "trim(" + std::to_string(c.step.positions) + ") outside 1.." +
                                         std::to_string(st.length)};
        }
        st.length -= c.step.positions;
        st.pending_first = st.pending_drafts = -1;
        return {};
      case StepKind::kFinish: st = State{}; return {};
      case StepKind::kReset:
        st.length = 0;
        st.pending_first = st.pending_drafts = -1;
        return {};
      case StepKind::kPrefill:
      case StepKind::kDecode:
      case StepKind::kVerify: return write_step(layer, st, c, answer);
      case StepKind::kPreempt: return Refusal{"unsupported", "the toy cache does not preempt"};
    }
    return Refusal{"bad-step", "unknown step kind"};
  }

  std::optional<std::uint64_t> fingerprint(std::int32_t layer_index) const override {
    const Layer& l = layers_[static_cast<std::size_t>(layer_index)];
    std::uint64_t h = kvcheck::engines::fnv1a(l.k.data(), l.k.size() * sizeof(double));
    h = kvcheck::engines::fnv1a(l.v.data(), l.v.size() * sizeof(double), h);
    h = kvcheck::engines::fnv1a(l.filled.data(), l.filled.size(), h);
    for (const State& s : l.states) {
      const std::int64_t words[5] = {s.busy ? 1 : 0, s.request, s.length, s.pending_first, s.pending_drafts};
      h = kvcheck::engines::fnv1a(words, sizeof words, h);
    }
    return h;
  }

 private:
  std::int64_t slot(std::int64_t state, std::int64_t position) const {
    return state * capacity_ + position % modulus_;
  }
  std::int64_t visible_first(std::int64_t p) const {
    return std::max<std::int64_t>(0, p - spec_.window_keys + 1);
  }

  double round(double x) const {
    return spec_.cache.format == kvcheck::scenarios::Format::kF32 ? static_cast<double>(static_cast<float>(x))
                                                                  : x;
  }

  /// RoPE of every head slice of `row` at `position`, in place.
  void rotate(double* row, std::int64_t heads, std::int64_t position) const {
    const auto& rope = spec_.cache.rope;
    if (rope.style == kvcheck::scenarios::RopeStyle::kNone || rope.rotary_dims == 0) return;
    const std::int64_t half = rope.rotary_dims / 2;
    const std::int64_t hd = spec_.cache.head_dim;
    for (std::int64_t i = 0; i < half; ++i) {
      const double theta = std::pow(rope.base, -2.0 * static_cast<double>(i) / rope.rotary_dims);
      const double c = std::cos(static_cast<double>(position) * theta);
      const double s = std::sin(static_cast<double>(position) * theta);
      const bool neox = rope.style == kvcheck::scenarios::RopeStyle::kNeox;
      const std::int64_t a = neox ? i : 2 * i;
      const std::int64_t b = neox ? i + half : 2 * i + 1;
      for (std::int64_t h = 0; h < heads; ++h) {
        double& x = row[h * hd + a];
        double& y = row[h * hd + b];
        const double nx = x * c - y * s;
        const double ny = x * s + y * c;
        x = nx;
        y = ny;
      }
    }
  }

  /// Attention of one rotated query over stored (key, value) rows.
  void attend(const double* q, const std::vector<std::pair<const double*, const double*>>& rows,
              double* out) const {
    const std::int64_t hd = spec_.cache.head_dim;
    const std::int64_t group = spec_.cache.q_heads / spec_.cache.kv_heads;
    const auto& sink = spec_.cache.sink_logit;
    std::vector<double> scores(rows.size());
    for (std::int64_t h = 0; h < spec_.cache.q_heads; ++h) {
      const std::int64_t ko = (h / group) * hd;
      double m = sink ? *sink : -INFINITY;
      for (std::size_t j = 0; j < rows.size(); ++j) {
        double dot = 0;
        for (std::int64_t d = 0; d < hd; ++d) dot += q[h * hd + d] * rows[j].first[ko + d];
        scores[j] = spec_.softmax_scale * dot;
        m = std::max(m, scores[j]);
      }
      double total = sink ? std::exp(*sink - m) : 0.0;
      for (double& s : scores) total += (s = std::exp(s - m));
      for (std::int64_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (std::size_t j = 0; j < rows.size(); ++j) acc += scores[j] * rows[j].second[ko + d];
        out[h * hd + d] = rows.empty() ? 0.0 : acc / total;
      }
    }
  }

  StepStatus write_step(Layer& layer, State& st, const StepCall& c, StepAnswer* answer) {
    // Every refusal before anything changes.
    if (st.pending_drafts >= 0) return Refusal{"verify-pending", "a verify awaits its accept"};
    if (c.position != st.length) {
      return Refusal{"position-mismatch",
                     "position " + std::to_string(c.position) + ", length " + std::to_string(st.length)};
    }
    const std::int64_t n = c.rows;
    if (n < 1 || n > spec_.max_step_rows) return Refusal{"too-many-rows", std::to_string(n) + " rows"};
    const bool shared = spec_.cache.shared_row;
    for (std::int64_t i = 0; i < n * kv_width_; ++i) {
      if (!std::isfinite(c.k[i]) || (!shared && !std::isfinite(c.v[i]))) {
        return Refusal{"non-finite-row", "a key or value is not finite"};
      }
    }
    for (std::int64_t i = 0; i < n * q_width_; ++i) {
      if (!std::isfinite(c.q[i])) return Refusal{"non-finite-row", "a query is not finite"};
    }

    const std::int64_t first = c.position;
    const auto w = static_cast<std::size_t>(kv_width_);
    // New rows as stored: keys RoPE'd at their position, both rounded.
    std::vector<double> keys(c.k, c.k + n * kv_width_);
    std::vector<double> values(shared ? keys.size() : static_cast<std::size_t>(n * kv_width_));
    for (std::int64_t i = 0; i < n; ++i) rotate(keys.data() + i * kv_width_, spec_.cache.kv_heads, first + i);
    for (double& x : keys) x = round(x);
    if (shared) {
      values = keys;
    } else {
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = round(c.v[i]);
    }
    std::vector<double> queries(c.q, c.q + n * q_width_);
    for (std::int64_t i = 0; i < n; ++i)
      rotate(queries.data() + i * q_width_, spec_.cache.q_heads, first + i);

    auto store = [&](std::int64_t i) {
      const std::int64_t s = slot(c.state, first + i);
      const auto at = static_cast<std::size_t>(s) * w;
      std::copy_n(keys.begin() + static_cast<std::ptrdiff_t>(i) * kv_width_, kv_width_, layer.k.begin() + at);
      std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(i) * kv_width_, kv_width_,
                  layer.v.begin() + at);
      layer.filled[static_cast<std::size_t>(s)] = 1;
      if (answer) answer->written.push_back(s);
    };

    const bool load_then_store =
        c.step.kind == StepKind::kPrefill && c.step.order == kvcheck::scenarios::Order::kLoadThenStore;
    std::vector<std::pair<const double*, const double*>> rows;
    if (answer) {
      answer->out.assign(static_cast<std::size_t>(n * q_width_), 0.0);
      answer->has_written = answer->has_reads = true;
      answer->read_offsets.push_back(0);
    }
    if (load_then_store) {
      // Copy the old rows the step's queries see, then store the chunk; each
      // query reads the copies and the chunk up to itself.
      const std::int64_t lo = visible_first(first);
      std::vector<double> old_k, old_v;
      std::vector<std::int64_t> old_slot;
      for (std::int64_t x = lo; x < first; ++x) {
        const std::int64_t s = slot(c.state, x);
        const auto at = static_cast<std::size_t>(s) * w;
        old_slot.push_back(layer.filled[static_cast<std::size_t>(s)] ? s : -1);
        old_k.insert(old_k.end(), layer.k.begin() + static_cast<std::ptrdiff_t>(at),
                     layer.k.begin() + static_cast<std::ptrdiff_t>(at + w));
        old_v.insert(old_v.end(), layer.v.begin() + static_cast<std::ptrdiff_t>(at),
                     layer.v.begin() + static_cast<std::ptrdiff_t>(at + w));
      }
      for (std::int64_t i = 0; i < n; ++i) store(i);
      for (std::int64_t i = 0; i < n && answer; ++i) {
        rows.clear();
        for (std::int64_t x = visible_first(first + i); x <= first + i; ++x) {
          if (x < first) {
            const auto o = static_cast<std::size_t>(x - lo);
            if (old_slot[o] < 0) continue;
            rows.emplace_back(old_k.data() + o * w, old_v.data() + o * w);
            answer->read_slots.push_back(old_slot[o]);
          } else {
            rows.emplace_back(keys.data() + (x - first) * kv_width_, values.data() + (x - first) * kv_width_);
            answer->read_slots.push_back(answer->written[static_cast<std::size_t>(x - first)]);
          }
        }
        attend(queries.data() + i * q_width_, rows, answer->out.data() + i * q_width_);
        answer->read_offsets.push_back(static_cast<std::int64_t>(answer->read_slots.size()));
      }
      if (answer) answer->view = kvcheck::engines::ReadView::kCausal;
    } else {
      // Store every row of the step, then every query reads the pool.
      for (std::int64_t i = 0; i < n; ++i) store(i);
      for (std::int64_t i = 0; i < n && answer; ++i) {
        rows.clear();
        for (std::int64_t x = visible_first(first + i); x <= first + i; ++x) {
          const std::int64_t s = slot(c.state, x);
          if (!layer.filled[static_cast<std::size_t>(s)]) continue;
          const auto at = static_cast<std::size_t>(s) * w;
          rows.emplace_back(layer.k.data() + at, layer.v.data() + at);
          answer->read_slots.push_back(s);
        }
        attend(queries.data() + i * q_width_, rows, answer->out.data() + i * q_width_);
        answer->read_offsets.push_back(static_cast<std::int64_t>(answer->read_slots.size()));
      }
      if (answer) answer->view = kvcheck::engines::ReadView::kAfterWrites;
    }
    if (c.step.kind == StepKind::kVerify) {
      st.pending_first = first;
      st.pending_drafts = c.step.drafts;
    } else {
      st.length = first + n;
    }
    return {};
  }

  CacheSpec spec_;
  std::int64_t capacity_;
  std::int64_t modulus_;
  std::int64_t kv_width_;
  std::int64_t q_width_;
  std::vector<Layer> layers_;
};

}  // namespace

ToyRingProvider::ToyRingProvider(Bug bug) : bug_(bug) {
  caps_.name = bug == Bug::kRingSizedWindow ? "toy-ring+ring-sized-window" : "toy-ring";
  caps_.formats = {kvcheck::scenarios::Format::kF64, kvcheck::scenarios::Format::kF32};
  caps_.ring_addressing = true;  // slots are state * ring_rows + position mod ring_rows
  caps_.probes = {"accept-without-verify", "accept-too-many", "begin-busy-state", "non-finite-row"};
}

std::unique_ptr<kvcheck::engines::CacheUnderTest> ToyRingProvider::open(
    const kvcheck::engines::CacheSpec& spec, Refusal* refused) {
  // What a toy keeps in memory: at most 2^20 rows per layer.
  if (spec.cache.states > (std::int64_t{1} << 20) / spec.cache.ring_rows) {
    *refused = Refusal{"too-large", std::to_string(spec.cache.states) + " states of " +
                                        std::to_string(spec.cache.ring_rows) + " rows"};
    return nullptr;
  }
  return std::make_unique<ToyRingCache>(spec, bug_);
}

}  // namespace toy
