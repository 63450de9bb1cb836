#include "engines/ring_pool_cache.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "impl/block_table.hpp"
#include "impl/cpu/cpu_backend.hpp"
#include "impl/cuda/attend_dispatch.hpp"
#include "impl/ring_pool.hpp"
#include "support/assert.hpp"
#include "support/error.hpp"

namespace kvcheck::engines {

namespace {

using scenarios::StepKind;

/// A device that fails (or is missing) is not the cache refusing a call:
/// the run stops with a typed error instead of scoring a refusal.
[[noreturn]] void throw_device(const impl::Status& st) {
  throw Error(ErrorId::kDevice, "--impl", std::string(impl::cache_error_name(st.code)) + ": " + st.detail);
}

bool device_broke(const impl::Status& st) {
  return st.code == impl::CacheError::kDeviceFailure || st.code == impl::CacheError::kNoDevice;
}

Refusal refusal(const impl::Status& st) {
  if (device_broke(st)) throw_device(st);
  return Refusal{std::string(impl::cache_error_name(st.code)), st.detail};
}

/// The pool of layer `l`: each layer's pool has its own window (a pool per
/// layer already). A global layer reads every position its ring holds: keys
/// past the ring and a step's rows reach no further (and size no buffer).
impl::PoolSpec layer_pool_spec(const CacheSpec& spec, std::int32_t l, impl::Fault fault) {
  impl::PoolSpec pool_spec = ring_pool_spec(spec, fault);
  if (!spec.layer_window_keys.empty()) {
    pool_spec.window_keys = std::min(spec.layer_window_keys[static_cast<std::size_t>(l)],
                                     spec.cache.ring_rows + spec.max_step_rows);
  }
  return pool_spec;
}

/// Reads one pool slot back for a checker; any failure is the device's.
void read_back(const impl::KvBackend& backend, std::int64_t slot, double* key, double* value) {
  if (const impl::Status st = backend.read_row(slot, key, value); !st.ok()) throw_device(st);
}

class RingPoolCache final : public CacheUnderTest {
 public:
  explicit RingPoolCache(std::vector<std::unique_ptr<impl::RingPool>> layers) : layers_(std::move(layers)) {}

  StepStatus call(const StepCall& c, StepAnswer* answer) override {
    KVCHECK_ASSERT(c.layer >= 0 && static_cast<std::size_t>(c.layer) < layers_.size());
    impl::RingPool& pool = *layers_[static_cast<std::size_t>(c.layer)];
    if (answer) answer->clear();
    impl::Status st;
    if (c.op == StepCall::Op::kBegin) {
      st = pool.begin(c.state, c.step.request);
      return st.ok() ? StepStatus{} : StepStatus{refusal(st)};
    }
    impl::StepResult result;
    const impl::StepRows in{c.k, c.v, c.q};
    bool writes = true;
    switch (c.step.kind) {
      case StepKind::kPrefill:
        st = pool.prefill(c.state, c.rows, in,
                          c.step.order == scenarios::Order::kLoadThenStore
                              ? impl::PrefillOrder::kLoadThenStore
                              : impl::PrefillOrder::kStoreThenLoad,
                          &result);
        break;
      case StepKind::kDecode: st = pool.decode(c.state, in, &result); break;
      case StepKind::kVerify: st = pool.verify(c.state, c.step.drafts, in, &result); break;
      case StepKind::kAccept:
        st = pool.accept(c.state, c.step.accepted);
        writes = false;
        break;
      case StepKind::kFinish:
        st = pool.finish(c.state);
        writes = false;
        break;
      case StepKind::kReset:
        st = pool.reset(c.state);
        writes = false;
        break;
      case StepKind::kTrim:
        st = pool.trim(c.state, c.step.positions);
        writes = false;
        break;
      case StepKind::kPreempt:
        // The ring pool does not declare preemption (docs/semantics.md "Preemption").
        return Refusal{"unsupported", "the CPU ring pool does not preempt"};
    }
    if (!st.ok()) return refusal(st);
    if (!writes || answer == nullptr) return {};
    answer->out.assign(result.out.begin(), result.out.end());
    answer->has_written = true;
    for (const auto& w : result.writes) answer->written.push_back(w.slot);
    answer->has_reads = true;
    answer->read_offsets.push_back(0);
    for (std::int64_t i = 0; i < result.queries; ++i) {
      for (std::int64_t col = 0; col < result.width; ++col) {
        const std::int64_t slot = result.read_slots[static_cast<std::size_t>(i * result.width + col)];
        if (slot >= 0) answer->read_slots.push_back(slot);
      }
      answer->read_offsets.push_back(static_cast<std::int64_t>(answer->read_slots.size()));
    }
    answer->view = result.source == impl::KvSource::kScratch ? ReadView::kCausal : ReadView::kAfterWrites;
    answer->duplicate_slots = result.duplicate_slots;
    report_stored(pool, result, answer);
    return {};
  }

  std::optional<std::uint64_t> fingerprint(std::int32_t layer) const override {
    const impl::RingPool& pool = *layers_[static_cast<std::size_t>(layer)];
    const impl::PoolSpec& spec = pool.spec();
    const auto width = static_cast<std::size_t>(spec.kv_heads) * static_cast<std::size_t>(spec.head_dim);
    std::vector<double> k(width), v(width);
    std::uint64_t h = fnv1a(nullptr, 0);
    for (std::int64_t slot = 0; slot < impl::pool_slot_count(spec); ++slot) {  // a paged pool's blocks too
      read_back(pool.backend_const(), slot, k.data(), v.data());
      h = hash_words(k.data(), width * sizeof(double), h);
      h = hash_words(v.data(), width * sizeof(double), h);
      const impl::Tag t = pool.backend_const().slot_tag(slot);
      const std::int64_t words[3] = {t.request, t.position, static_cast<std::int64_t>(t.write_seq)};
      h = hash_words(words, sizeof words, h);
    }
    for (std::int64_t b = 0; b < spec.states; ++b) {
      const impl::StateInfo& s = pool.state(b);
      const std::int64_t words[4] = {s.busy ? 1 : 0, s.request, s.length, s.pending_drafts};
      h = fnv1a(words, sizeof words, h);
    }
    return h;
  }

  /// The rows this step stored, read back from the pool: decoded values
  /// always, bytes when the backend gives them. A row whose slot a later
  /// row of the same step took over is marked unknown.
  static void report_stored(const impl::RingPool& pool, const impl::StepResult& result, StepAnswer* answer) {
    const impl::KvBackend& backend = pool.backend_const();
    const impl::PoolSpec& spec = pool.spec();
    const std::int64_t width = static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim;
    const std::int64_t bytes = format_row_bytes(spec.format, width);
    const auto rows = static_cast<std::int64_t>(result.writes.size());
    answer->has_stored = true;
    answer->has_stored_bytes = true;
    answer->stored_k.assign(static_cast<std::size_t>(rows * width), 0.0);
    answer->stored_v.assign(spec.shared_row ? 0 : static_cast<std::size_t>(rows * width), 0.0);
    answer->stored_known.assign(static_cast<std::size_t>(rows), 0);
    answer->stored_k_bytes.assign(static_cast<std::size_t>(rows * bytes), 0);
    answer->stored_v_bytes.assign(spec.shared_row ? 0 : static_cast<std::size_t>(rows * bytes), 0);
    std::vector<double> v(static_cast<std::size_t>(width));
    std::vector<std::uint8_t> vb(static_cast<std::size_t>(bytes));
    for (std::int64_t i = 0; i < rows; ++i) {
      const impl::WriteRecord& w = result.writes[static_cast<std::size_t>(i)];
      if (backend.slot_tag(w.slot) != w.written) continue;
      answer->stored_known[static_cast<std::size_t>(i)] = 1;
      double* const k = answer->stored_k.data() + i * width;
      double* const vv = spec.shared_row ? v.data() : answer->stored_v.data() + i * width;
      read_back(backend, w.slot, k, vv);
      std::uint8_t* const kb = answer->stored_k_bytes.data() + i * bytes;
      std::uint8_t* const vbp = spec.shared_row ? vb.data() : answer->stored_v_bytes.data() + i * bytes;
      if (const impl::Status st = backend.read_row_bytes(w.slot, kb, vbp); !st.ok()) {
        if (device_broke(st)) throw_device(st);
        answer->has_stored_bytes = false;  // kUnsupported: this backend keeps no bytes to give
      }
    }
    if (!answer->has_stored_bytes) {
      answer->stored_k_bytes.clear();
      answer->stored_v_bytes.clear();
    }
  }

 private:
  std::vector<std::unique_ptr<impl::RingPool>> layers_;
};

class RingPoolProvider final : public CacheProvider {
 public:
  /// `block_rows` 0: the ring; else a block table of blocks that size (paged).
  RingPoolProvider(std::string backend, impl::Fault fault, std::int64_t block_rows = 0)
      : backend_(std::move(backend)), fault_(fault), block_rows_(block_rows) {
    caps_ = ring_pool_capabilities(backend_, fault_, block_rows_, impl::make_backend(backend_, nullptr));
    caps_.slots_in_pool = true;  // slots past the pool are impossible
  }
  const Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return block_rows_ > 0 ? "paged" : backend_; }

  std::unique_ptr<CacheUnderTest> open(const CacheSpec& spec, Refusal* refused) override {
    std::vector<std::unique_ptr<impl::RingPool>> layers;
    for (std::int32_t l = 0; l < spec.cache.layers; ++l) {
      impl::PoolSpec pool_spec = layer_pool_spec(spec, l, fault_);
      std::string why;
      auto backend = impl::make_backend(backend_, &why);
      if (!backend) throw Error(ErrorId::kDevice, "--impl", why);
      std::unique_ptr<impl::RingPool> pool;
      const impl::Status st = block_rows_ > 0 ? create_paged(std::move(backend), spec, &pool_spec, &pool)
                                              : impl::RingPool::create(std::move(backend), pool_spec, &pool);
      if (!st.ok()) {
        *refused = refusal(st);
        return nullptr;
      }
      layers.push_back(std::move(pool));
    }
    return std::make_unique<RingPoolCache>(std::move(layers));
  }

 private:
  /// One layer's pool over a block table: ceil(capacity / B) entries per
  /// state, the spec's pool of blocks (paged_pool_blocks when it gives none).
  impl::Status create_paged(std::unique_ptr<impl::KvBackend> backend, const CacheSpec& spec,
                            impl::PoolSpec* pool_spec, std::unique_ptr<impl::RingPool>* out) const {
    const std::int64_t blocks = paged_pool_blocks(spec, block_rows_);
    const std::int64_t entries = (spec.cache.ring_rows + block_rows_ - 1) / block_rows_;
    std::unique_ptr<impl::BlockTable> table;
    if (const impl::Status st = impl::BlockTable::create(spec.cache.states, block_rows_, entries, blocks, &table);
        !st.ok()) {
      return st;
    }
    if (__builtin_mul_overflow(blocks, block_rows_, &pool_spec->pool_slots)) {
      return impl::Status::fail(impl::CacheError::kSizeOverflow, "paged pool: blocks * block rows overflows");
    }
    return impl::RingPool::create(std::move(backend), *pool_spec, std::move(table), out);
  }

  std::string backend_;
  impl::Fault fault_;
  std::int64_t block_rows_ = 0;
  Capabilities caps_;
};

}  // namespace

impl::RopeStyle impl_rope_style(scenarios::RopeStyle s) noexcept {
  switch (s) {
    case scenarios::RopeStyle::kNone: return impl::RopeStyle::kNone;
    case scenarios::RopeStyle::kNeox: return impl::RopeStyle::kNeox;
    case scenarios::RopeStyle::kInterleaved: return impl::RopeStyle::kInterleaved;
  }
  return impl::RopeStyle::kNone;
}

impl::PoolSpec ring_pool_spec(const CacheSpec& spec, impl::Fault fault) {
  const auto& c = spec.cache;
  impl::PoolSpec p;
  p.states = c.states;
  p.ring_rows = c.ring_rows;
  p.window_keys = spec.window_keys;
  p.q_heads = c.q_heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.shared_row = c.shared_row;
  p.format = c.format;  // one format type (support/formats.hpp)
  p.rope_style = impl_rope_style(c.rope.style);
  p.rope_dims = c.rope.rotary_dims;
  p.rope_base = c.rope.base;
  p.softmax_scale = c.softmax_scale.value_or(0.0);
  p.has_sink = c.sink_logit.has_value();
  p.sink_logit = c.sink_logit.value_or(0.0);
  p.max_step_rows = spec.max_step_rows;
  p.track_tags = true;
  p.fault = fault;
  return p;
}

Capabilities ring_pool_capabilities(const std::string& backend, impl::Fault fault, std::int64_t block_rows,
                                    std::shared_ptr<const impl::KvBackend> probe) {
  Capabilities caps;
  caps.name = block_rows > 0 ? "paged-pool/" + backend : "ring-pool/" + backend;
  caps.ring_addressing = block_rows == 0;
  caps.block_size = block_rows;
  caps.per_layer_windows = true;  // one pool per layer, each with its own window
  caps.probes = {"accept-without-verify", "accept-too-many", "non-finite-row", "begin-busy-state"};
  // The step kinds (trim included) are RingPool's for every backend; shared
  // prefixes are no pool's (prefix_sharing stays off).
  // The CPU kernel table rotates keys and queries in double (std::cos/sin
  // of a double angle) whatever the row format.
  if (backend == "cpu") caps.rope_unit_roundoff = 0x1.0p-53;
  // Its AVX-512 block kernel, where this CPU has it: the dispatch
  // CpuBackend::configure makes (coverage class fast_cpu_kernel).
  if (backend == "cpu" && impl::cpu::fast_kernel_available()) {
    caps.fast_kernel_runs = [](const CacheSpec& spec) {
      return impl::cpu::fast_kernel_runs(ring_pool_spec(spec, impl::Fault::kNone));
    };
  }
  // The CUDA attention kernels take head_dim up to 512 (CudaBackend::supports).
  if (backend == "cuda") caps.head_dims.max = impl::cuda::kAttendMaxHeadDim;
  // The backend's kernel paths, by its own dispatch, over every layer's pool.
  if (probe && !probe->attend_paths().empty()) {
    caps.kernel_paths = probe->attend_paths();
    caps.kernel_paths_run = [probe, fault](const CacheSpec& spec,
                                           std::span<const std::int64_t> step_queries) {
      std::vector<bool> reached(probe->attend_paths().size(), false);
      for (std::int32_t l = 0; l < spec.cache.layers; ++l) {
        const std::vector<bool> layer =
            probe->attend_paths_run(layer_pool_spec(spec, l, fault), step_queries);
        for (std::size_t i = 0; i < reached.size() && i < layer.size(); ++i)
          reached[i] = reached[i] || layer[i];
      }
      return reached;
    };
  }
  return caps;
}

std::unique_ptr<CacheProvider> make_ring_pool_provider(const std::string& backend, impl::Fault fault) {
  std::string why;
  if (!impl::make_backend(backend, &why)) throw Error(ErrorId::kDevice, "--impl", why);
  return std::make_unique<RingPoolProvider>(backend, fault);
}

std::unique_ptr<CacheProvider> make_paged_pool_provider(const std::string& backend, impl::Fault fault,
                                                        std::int64_t block_rows) {
  if (block_rows < 1) throw Error(ErrorId::kUsage, "--impl", "a paged pool needs blocks of at least one row");
  std::string why;
  if (!impl::make_backend(backend, &why)) throw Error(ErrorId::kDevice, "--impl", why);
  return std::make_unique<RingPoolProvider>(backend, fault, block_rows);
}

}  // namespace kvcheck::engines
