// CudaBackend: the KvBackend kernel table on one CUDA device. configure()
// allocates the pool, its tags, scratch and every staging buffer once; each
// call then validates its host inputs exactly as the CPU backend does (same
// checks, same order, same error codes), copies them to the device, launches
// the kernels of impl/cuda/ring_kernels.cuh and copies results back. Every
// CUDA call is checked and a failure becomes CacheError::kDeviceFailure with
// the call named, never an abort. A call that is refused writes nothing: all
// checks (including the format-range check of the rotated rows, done on the
// device before any encode) precede the first write to pool or scratch.
#include "impl/cuda/cuda_backend.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "impl/cuda/attend_dispatch.hpp"
#include "impl/cuda/ring_kernels.cuh"
#include "impl/element_format.hpp"
#include "impl/kernel_checks.hpp"
#include "impl/ring_index.hpp"
#include "impl/row_codec.hpp"

namespace kvcheck::impl {

namespace cuda {
namespace {

// Largest magnitude a non-f64 row may hold after RoPE (the CPU backend's
// kFloatRowLimit): keeps bf16 rounding and fp8 dequantization in float range.
constexpr double kFloatRowLimit = 0x1.0p126;
// The split-attention workspace's bound (so a pool with a huge max_step_rows
// does not reserve gigabytes for partial sums) and the most splits:
// kAttendWorkspaceBytes and kAttendMaxSplits, impl/cuda/attend_dispatch.hpp.

std::string cuda_error_line(const char* what, cudaError_t err) {
  return std::string("CUDA ") + what + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
         ")";
}

Status device_status(const char* what, cudaError_t err) {
  if (err == cudaSuccess) return {};
  return Status::fail(err == cudaErrorMemoryAllocation ? CacheError::kAllocation : CacheError::kDeviceFailure,
                      cuda_error_line(what, err));
}

#define KVCHECK_CUDA_TRY(what, expr)                             \
  do {                                                           \
    if (Status st_ = device_status((what), (expr)); !st_.ok()) { \
      return st_;                                                \
    }                                                            \
  } while (0)

bool mul_overflows(std::int64_t a, std::int64_t b, std::int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

/// One owning device allocation (cudaMalloc / cudaFree).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  cudaError_t allocate(std::int64_t bytes) {
    release();
    bytes_ = bytes;
    if (bytes <= 0) return cudaSuccess;
    return cudaMalloc(&ptr_, static_cast<std::size_t>(bytes));
  }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }

 private:
  void release() noexcept {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  std::int64_t bytes_ = 0;
};

/// All device memory of one configured pool (swapped in whole by configure).
struct DeviceState {
  DeviceBuffer pool;            // [slots, slot_bytes]
  DeviceBuffer tags;            // [slots] Tag (tracking only)
  DeviceBuffer scratch;         // [scratch_rows, slot_bytes]
  DeviceBuffer scratch_tags;    // [scratch_rows] Tag
  DeviceBuffer scratch_origin;  // [scratch_rows] int64 pool slot each row represents
  DeviceBuffer counts;          // [slots] uint32 writes per slot in one store, 0 between
  DeviceBuffer winner;          // [slots] int32 last row writing a slot, -1 between
  DeviceBuffer flags;           // [2] u64 duplicates, then u32 out-of-range flag
  DeviceBuffer slots;           // [item_cap] int64 store slots / scratch origins
  DeviceBuffer positions;       // [item_cap] int64 rope positions
  DeviceBuffer tags_in;         // [item_cap] Tag
  DeviceBuffer k_in;            // [max_step_rows, kv_heads, head_dim] double
  DeviceBuffer v_in;            // [max_step_rows, kv_heads, head_dim] double
  DeviceBuffer k_rot;           // [max_step_rows, kv_heads, head_dim] double, rotated
  DeviceBuffer v_chk;           // [max_step_rows, kv_heads, head_dim] double, range-checked copy
  DeviceBuffer q_in;            // [max_step_rows, q_heads, head_dim] double
  DeviceBuffer q_rot;           // [max_step_rows, q_heads, head_dim] Acc
  DeviceBuffer out;             // [max_step_rows, q_heads, head_dim] double
  DeviceBuffer index;           // [index_cap] int64
  DeviceBuffer read_tags;       // [index_cap] Tag
  DeviceBuffer read_slots;      // [index_cap] int64
  DeviceBuffer part_acc;        // [max_step_rows, q_heads, splits_cap, head_dim] Acc
  DeviceBuffer part_ml;         // [max_step_rows, q_heads, splits_cap, 2] Acc
  DeviceBuffer counters;        // [max_step_rows, q_heads] uint32 finished splits, 0 between
};

class CudaBackend final : public KvBackend {
 public:
  std::string_view name() const noexcept override { return "cuda"; }
  bool supports(const PoolSpec& spec, std::string* why) const override;
  Status configure(const PoolSpec& spec) override;
  Status store(std::span<const std::int64_t> slots, std::span<const std::int64_t> rope_positions,
               const double* k, const double* v, std::span<const Tag> tags, StoreReport* report) override;
  Status load(std::span<const std::int64_t> index, std::int64_t scratch_first) override;
  Status scratch_store(std::int64_t scratch_first, std::span<const std::int64_t> origin_slots,
                       std::span<const std::int64_t> rope_positions, const double* k, const double* v,
                       std::span<const Tag> tags) override;
  Status attend(KvSource source, std::span<const std::int64_t> rope_positions, const double* q,
                std::span<const std::int64_t> index, std::int64_t width, double* out, Tag* read_tags,
                std::int64_t* read_slots) override;
  Tag slot_tag(std::int64_t slot) const override;
  Status read_row(std::int64_t slot, double* key, double* value) const override;
  Status read_row_bytes(std::int64_t slot, std::uint8_t* key, std::uint8_t* value) const override;
  std::vector<std::string> attend_paths() const override;
  std::vector<bool> attend_paths_run(const PoolSpec& spec,
                                     std::span<const std::int64_t> step_queries) const override;
  std::vector<std::int64_t> attend_paths_launched() const override;

 private:
  Status check_configured() const;
  /// The sizes the shared kernel argument checks (impl/kernel_checks.hpp) use.
  KernelBounds bounds() const;
  /// Validates, uploads, rotates and range-checks `rows` key/value rows into
  /// d_.k_rot / d_.v_chk (CpuBackend::stage_rows). Writes nothing to the pool.
  Status stage_rows(std::int64_t rows, std::span<const std::int64_t> rope_positions, const double* k,
                    const double* v);
  /// Copies one pool slot's bytes to host_slot_.
  Status fetch_slot(std::int64_t slot, const char* what) const;
  /// Encodes the staged rows to `base` rows (dest_rows[r] or dest_first + r).
  Status encode_rows(std::int64_t rows, std::uint8_t* base, const std::int64_t* dest_rows,
                     std::int64_t dest_first, std::int64_t dest_count, const int* winner);
  Status sync(const char* what) const;

  PoolSpec spec_;
  bool configured_ = false;
  SlotLayout layout_;
  RopeParams rope_;
  std::int64_t slots_ = 0;         // pool_slot_count(spec)
  std::int64_t scratch_rows_ = 0;  // window keys + max_step_rows
  std::int64_t item_cap_ = 0;      // entries of the per-row staging arrays
  std::int64_t index_cap_ = 0;     // entries of the index staging array
  std::int32_t splits_cap_ = 1;
  int sm_count_ = 1;
  AttendDevice device_;  // what the dispatch reads of the device (ring_attend_device)
  std::array<std::int64_t, kAttendPathCount> launched_{};  // launches per attend path since configure
  double scale_ = 1.0;
  DeviceState d_;
  mutable std::vector<std::uint8_t> host_slot_;  // [slot_bytes] read_row staging
};

bool CudaBackend::supports(const PoolSpec& spec, std::string* why) const {
  auto no = [&](std::string text) {
    if (why) *why = std::move(text);
    return false;
  };
  if (auto valid = validate_pool_spec(spec); !valid.ok()) return no(valid.detail);
  if (spec.head_dim > kAttendMaxHeadDim) {
    return no("cuda backend: head_dim " + std::to_string(spec.head_dim) + " > " +
              std::to_string(kAttendMaxHeadDim) + " (attention kernel limit)");
  }
  return true;
}

Status CudaBackend::configure(const PoolSpec& spec) {
  std::string why;
  if (!cuda_device_available(&why)) return Status::fail(CacheError::kNoDevice, why);
  if (auto st = validate_pool_spec(spec); !st.ok()) return st;
  if (!supports(spec, &why)) return Status::fail(CacheError::kUnsupported, why);
  SlotLayout layout;
  layout.kv_heads = spec.kv_heads;
  layout.head_dim = spec.head_dim;
  layout.shared_row = spec.shared_row;
  const std::int64_t keys = ring_window_keys(spec.window_keys, spec.fault);
  const std::int64_t scratch_rows = keys + spec.max_step_rows;
  const std::int64_t item_cap = std::max(spec.max_step_rows, scratch_rows);
  std::int64_t slots = 0, pool_bytes = 0, scratch_bytes = 0, q_elements = 0, step_q = 0, step_kv = 0,
               index_cap = 0, per_split = 0;
  slots = pool_slot_count(spec);
  if (mul_overflows(spec.kv_heads, spec.head_dim, &layout.row_elements) ||
      mul_overflows(spec.q_heads, spec.head_dim, &q_elements) ||
      mul_overflows(spec.max_step_rows, q_elements, &step_q) ||
      mul_overflows(spec.max_step_rows, layout.row_elements, &step_kv) ||
      mul_overflows(spec.max_step_rows, scratch_rows, &index_cap) ||
      mul_overflows(step_q, spec.head_dim + 2, &per_split) || layout.row_elements > (std::int64_t{1} << 40)) {
    return Status::fail(CacheError::kSizeOverflow, "pool size overflows");
  }
  layout.row_bytes = format_row_bytes(spec.format, layout.row_elements);
  layout.slot_bytes = spec.shared_row ? layout.row_bytes : 2 * layout.row_bytes;
  index_cap = std::max(index_cap, item_cap);
  if (mul_overflows(slots, layout.slot_bytes, &pool_bytes) ||
      mul_overflows(scratch_rows, layout.slot_bytes, &scratch_bytes) ||
      step_q > (std::int64_t{1} << 58) / 8 || step_kv > (std::int64_t{1} << 58) / 8 ||
      index_cap > (std::int64_t{1} << 58) / static_cast<std::int64_t>(sizeof(Tag)) ||
      slots > std::numeric_limits<int>::max()) {
    return Status::fail(CacheError::kSizeOverflow, "pool size overflows");
  }
  // Splits the workspace can hold for a full step: at least 1 (a step always
  // fits one split), at most kAttendMaxSplits (the host dispatch's own bound).
  const std::int64_t acc_bytes = spec.format == ElementFormat::kF64 ? 8 : 4;
  const std::int64_t splits_cap =
      attend_max_splits(spec.format, spec.max_step_rows, spec.q_heads, spec.head_dim);

  KVCHECK_CUDA_TRY("cudaSetDevice", cudaSetDevice(0));
  int sm_count = 1;
  KVCHECK_CUDA_TRY("cudaDeviceGetAttribute(multiProcessorCount)",
                   cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));

  DeviceState d;
  const std::int64_t tag_bytes = sizeof(Tag);
  KVCHECK_CUDA_TRY("cudaMalloc(pool)", d.pool.allocate(pool_bytes));
  KVCHECK_CUDA_TRY("cudaMalloc(tags)", d.tags.allocate(spec.track_tags ? slots * tag_bytes : 0));
  KVCHECK_CUDA_TRY("cudaMalloc(scratch)", d.scratch.allocate(scratch_bytes));
  KVCHECK_CUDA_TRY("cudaMalloc(scratch tags)", d.scratch_tags.allocate(scratch_rows * tag_bytes));
  KVCHECK_CUDA_TRY("cudaMalloc(scratch origin)", d.scratch_origin.allocate(scratch_rows * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(counts)", d.counts.allocate(slots * 4));
  KVCHECK_CUDA_TRY("cudaMalloc(winner)", d.winner.allocate(slots * 4));
  KVCHECK_CUDA_TRY("cudaMalloc(flags)", d.flags.allocate(16));
  KVCHECK_CUDA_TRY("cudaMalloc(slots)", d.slots.allocate(item_cap * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(positions)", d.positions.allocate(item_cap * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(tags in)", d.tags_in.allocate(item_cap * tag_bytes));
  KVCHECK_CUDA_TRY("cudaMalloc(k in)", d.k_in.allocate(step_kv * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(v in)", d.v_in.allocate(step_kv * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(k rot)", d.k_rot.allocate(step_kv * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(v chk)", d.v_chk.allocate(step_kv * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(q in)", d.q_in.allocate(step_q * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(q rot)", d.q_rot.allocate(step_q * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(out)", d.out.allocate(step_q * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(index)", d.index.allocate(index_cap * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(read tags)", d.read_tags.allocate(index_cap * tag_bytes));
  KVCHECK_CUDA_TRY("cudaMalloc(read slots)", d.read_slots.allocate(index_cap * 8));
  KVCHECK_CUDA_TRY("cudaMalloc(partial acc)", d.part_acc.allocate(step_q * splits_cap * acc_bytes));
  KVCHECK_CUDA_TRY("cudaMalloc(partial ml)",
                   d.part_ml.allocate(spec.max_step_rows * spec.q_heads * splits_cap * 2 * acc_bytes));
  // One counter per (query, KV head, head tile) of the fast kernel: at most
  // one per query head.
  KVCHECK_CUDA_TRY("cudaMalloc(split counters)", d.counters.allocate(spec.max_step_rows * spec.q_heads * 4));

  // Fresh pool: zero bytes, empty tags, no claims, origin -1.
  KVCHECK_CUDA_TRY("cudaMemset(pool)",
                   cudaMemset(d.pool.as<void>(), 0, static_cast<std::size_t>(pool_bytes)));
  KVCHECK_CUDA_TRY("cudaMemset(scratch)",
                   cudaMemset(d.scratch.as<void>(), 0, static_cast<std::size_t>(scratch_bytes)));
  KVCHECK_CUDA_TRY("cudaMemset(counts)",
                   cudaMemset(d.counts.as<void>(), 0, static_cast<std::size_t>(slots * 4)));
  KVCHECK_CUDA_TRY("cudaMemset(winner)",
                   cudaMemset(d.winner.as<void>(), 0xFF, static_cast<std::size_t>(slots * 4)));
  KVCHECK_CUDA_TRY("cudaMemset(flags)", cudaMemset(d.flags.as<void>(), 0, 16));
  KVCHECK_CUDA_TRY(
      "cudaMemset(split counters)",
      cudaMemset(d.counters.as<void>(), 0, static_cast<std::size_t>(spec.max_step_rows * spec.q_heads * 4)));
  if (spec.track_tags) {
    ring_fill_kernel<Tag><<<ring_grid(slots), kElementwiseThreads>>>(d.tags.as<Tag>(), slots, Tag{});
    KVCHECK_CUDA_TRY("launch ring_fill_kernel(tags)", cudaGetLastError());
  }
  ring_fill_kernel<Tag>
      <<<ring_grid(scratch_rows), kElementwiseThreads>>>(d.scratch_tags.as<Tag>(), scratch_rows, Tag{});
  KVCHECK_CUDA_TRY("launch ring_fill_kernel(scratch tags)", cudaGetLastError());
  ring_fill_kernel<std::int64_t><<<ring_grid(scratch_rows), kElementwiseThreads>>>(
      d.scratch_origin.as<std::int64_t>(), scratch_rows, std::int64_t{-1});
  KVCHECK_CUDA_TRY("launch ring_fill_kernel(scratch origin)", cudaGetLastError());
  KVCHECK_CUDA_TRY("configure (device sync)", cudaDeviceSynchronize());

  try {
    host_slot_.assign(static_cast<std::size_t>(layout.slot_bytes), 0);
  } catch (const std::bad_alloc&) {
    return Status::fail(CacheError::kAllocation, "read_row staging allocation failed");
  }
  d_ = std::move(d);
  spec_ = spec;
  layout_ = layout;
  rope_.style = spec.rope_style;
  rope_.rope_dims = spec.rope_dims;
  rope_.base = spec.rope_base;
  slots_ = slots;
  scratch_rows_ = scratch_rows;
  item_cap_ = item_cap;
  index_cap_ = index_cap;
  splits_cap_ = static_cast<std::int32_t>(splits_cap);
  sm_count_ = sm_count > 0 ? sm_count : 1;
  device_ = ring_attend_device(sm_count_);
  launched_ = {};
  scale_ =
      spec.softmax_scale > 0.0 ? spec.softmax_scale : 1.0 / std::sqrt(static_cast<double>(spec.head_dim));
  configured_ = true;
  return {};
}

Status CudaBackend::check_configured() const {
  if (!configured_) return Status::fail(CacheError::kUnsupported, "backend not configured");
  return {};
}

KernelBounds CudaBackend::bounds() const {
  return KernelBounds{slots_,
                      scratch_rows_,
                      spec_.max_step_rows,
                      scratch_rows_,
                      static_cast<std::int64_t>(spec_.q_heads) * spec_.head_dim,
                      spec_.track_tags};
}

Status CudaBackend::sync(const char* what) const {
  return device_status(what, cudaDeviceSynchronize());
}

Status CudaBackend::stage_rows(std::int64_t rows, std::span<const std::int64_t> rope_positions,
                               const double* k, const double* v) {
  if (rows > spec_.max_step_rows) {
    return Status::fail(CacheError::kTooManyRows, "more rows than max_step_rows");
  }
  if (static_cast<std::int64_t>(rope_positions.size()) != rows) {
    return Status::fail(CacheError::kBadArgument, "rope_positions size != rows");
  }
  if (rows > 0 && (k == nullptr || (!spec_.shared_row && v == nullptr))) {
    return Status::fail(CacheError::kBadArgument, "missing key or value rows");
  }
  const std::int64_t n = rows * layout_.row_elements;
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(k[i]) || (!spec_.shared_row && !std::isfinite(v[i]))) {
      return Status::fail(CacheError::kNonFinite, "non-finite key or value element");
    }
  }
  for (auto p : rope_positions) {
    if (p < 0) return Status::fail(CacheError::kNegativePosition, "negative rope position");
  }
  if (rows == 0) return {};
  const double limit =
      spec_.format == ElementFormat::kF64 ? std::numeric_limits<double>::max() : kFloatRowLimit;
  const auto bytes = static_cast<std::size_t>(n) * sizeof(double);
  unsigned int* flag = reinterpret_cast<unsigned int*>(d_.flags.as<std::uint8_t>() + 8);
  KVCHECK_CUDA_TRY("cudaMemset(range flag)", cudaMemset(flag, 0, sizeof(unsigned int)));
  KVCHECK_CUDA_TRY("cudaMemcpy(positions)", cudaMemcpy(d_.positions.as<void>(), rope_positions.data(),
                                                       rope_positions.size_bytes(), cudaMemcpyHostToDevice));
  KVCHECK_CUDA_TRY("cudaMemcpy(k)", cudaMemcpy(d_.k_in.as<void>(), k, bytes, cudaMemcpyHostToDevice));
  ring_rotate_rows_kernel<double><<<ring_grid(n), kElementwiseThreads>>>(
      d_.k_in.as<double>(), rows, spec_.kv_heads, spec_.head_dim, d_.positions.as<std::int64_t>(), rope_,
      true, 1.0, limit, flag, d_.k_rot.as<double>());
  KVCHECK_CUDA_TRY("launch ring_rotate_rows_kernel(k)", cudaGetLastError());
  if (!spec_.shared_row) {
    KVCHECK_CUDA_TRY("cudaMemcpy(v)", cudaMemcpy(d_.v_in.as<void>(), v, bytes, cudaMemcpyHostToDevice));
    ring_rotate_rows_kernel<double><<<ring_grid(n), kElementwiseThreads>>>(
        d_.v_in.as<double>(), rows, spec_.kv_heads, spec_.head_dim, d_.positions.as<std::int64_t>(), rope_,
        false, 1.0, limit, flag, d_.v_chk.as<double>());
    KVCHECK_CUDA_TRY("launch ring_rotate_rows_kernel(v)", cudaGetLastError());
  }
  unsigned int out_of_range = 0;
  KVCHECK_CUDA_TRY("cudaMemcpy(range flag)",
                   cudaMemcpy(&out_of_range, flag, sizeof out_of_range, cudaMemcpyDeviceToHost));
  if (out_of_range != 0) {
    return Status::fail(CacheError::kNonFinite, "key or value row leaves the element format's range");
  }
  return {};
}

Status CudaBackend::encode_rows(std::int64_t rows, std::uint8_t* base, const std::int64_t* dest_rows,
                                std::int64_t dest_first, std::int64_t dest_count, const int* winner) {
  const std::int64_t units = spec_.format == ElementFormat::kFp8
                                 ? (layout_.row_elements + kFp8BlockElements - 1) / kFp8BlockElements
                                 : layout_.row_elements;
  const unsigned grid = ring_grid(rows * (spec_.shared_row ? 1 : 2) * units);
  const double* k = d_.k_rot.as<double>();
  const double* v = d_.v_chk.as<double>();
  switch (spec_.format) {
    case ElementFormat::kF64:
      ring_encode_rows_kernel<ElementFormat::kF64><<<grid, kElementwiseThreads>>>(
          k, v, rows, layout_, dest_rows, dest_first, dest_count, winner, base);
      break;
    case ElementFormat::kF32:
      ring_encode_rows_kernel<ElementFormat::kF32><<<grid, kElementwiseThreads>>>(
          k, v, rows, layout_, dest_rows, dest_first, dest_count, winner, base);
      break;
    case ElementFormat::kBf16:
      ring_encode_rows_kernel<ElementFormat::kBf16><<<grid, kElementwiseThreads>>>(
          k, v, rows, layout_, dest_rows, dest_first, dest_count, winner, base);
      break;
    case ElementFormat::kFp8:
      ring_encode_rows_kernel<ElementFormat::kFp8><<<grid, kElementwiseThreads>>>(
          k, v, rows, layout_, dest_rows, dest_first, dest_count, winner, base);
      break;
  }
  return device_status("launch ring_encode_rows_kernel", cudaGetLastError());
}

Status CudaBackend::store(std::span<const std::int64_t> slots, std::span<const std::int64_t> rope_positions,
                          const double* k, const double* v, std::span<const Tag> tags, StoreReport* report) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto rows = static_cast<std::int64_t>(slots.size());
  if (auto st = check_store(bounds(), slots, tags); !st.ok()) return st;
  if (auto st = stage_rows(rows, rope_positions, k, v); !st.ok()) return st;
  if (rows == 0) {
    if (report) report->duplicate_slots = 0;
    return {};
  }
  // Commit. The claim kernel elects one writer per slot (the last row, as a
  // sequential store leaves it) and counts the slots written twice, so a
  // same-launch write-write collision is reported, never a race.
  auto* duplicates = d_.flags.as<unsigned long long>();
  KVCHECK_CUDA_TRY("cudaMemset(duplicates)", cudaMemset(duplicates, 0, sizeof(unsigned long long)));
  KVCHECK_CUDA_TRY("cudaMemcpy(slots)",
                   cudaMemcpy(d_.slots.as<void>(), slots.data(), slots.size_bytes(), cudaMemcpyHostToDevice));
  const bool track = spec_.track_tags;
  if (track) {
    KVCHECK_CUDA_TRY("cudaMemcpy(tags)", cudaMemcpy(d_.tags_in.as<void>(), tags.data(), tags.size_bytes(),
                                                    cudaMemcpyHostToDevice));
  }
  const auto* d_slots = d_.slots.as<std::int64_t>();
  ring_claim_slots_kernel<<<ring_grid(rows), kElementwiseThreads>>>(
      d_slots, rows, slots_, d_.counts.as<unsigned int>(), d_.winner.as<int>(), duplicates);
  KVCHECK_CUDA_TRY("launch ring_claim_slots_kernel", cudaGetLastError());
  if (auto st = encode_rows(rows, d_.pool.as<std::uint8_t>(), d_slots, 0, slots_, d_.winner.as<int>());
      !st.ok()) {
    return st;
  }
  if (track) {
    ring_write_row_meta_kernel<<<ring_grid(rows), kElementwiseThreads>>>(
        rows, d_slots, 0, slots_, d_.winner.as<int>(), d_.tags_in.as<Tag>(), d_.tags.as<Tag>(), nullptr,
        nullptr);
    KVCHECK_CUDA_TRY("launch ring_write_row_meta_kernel", cudaGetLastError());
  }
  ring_release_slots_kernel<<<ring_grid(rows), kElementwiseThreads>>>(
      d_slots, rows, slots_, d_.counts.as<unsigned int>(), d_.winner.as<int>());
  KVCHECK_CUDA_TRY("launch ring_release_slots_kernel", cudaGetLastError());
  unsigned long long dup = 0;
  KVCHECK_CUDA_TRY("cudaMemcpy(duplicates)",
                   cudaMemcpy(&dup, duplicates, sizeof dup, cudaMemcpyDeviceToHost));
  if (report) report->duplicate_slots = static_cast<std::int64_t>(dup);
  return {};
}

Status CudaBackend::load(std::span<const std::int64_t> index, std::int64_t scratch_first) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto n = static_cast<std::int64_t>(index.size());
  if (auto st = check_load(bounds(), index, scratch_first); !st.ok()) return st;
  if (n == 0) return {};
  if (n > index_cap_)
    return Status::fail(CacheError::kTooManyRows, "load: larger than the device staging holds");
  KVCHECK_CUDA_TRY("cudaMemcpy(index)",
                   cudaMemcpy(d_.index.as<void>(), index.data(), index.size_bytes(), cudaMemcpyHostToDevice));
  const unsigned grid = static_cast<unsigned>(std::min<std::int64_t>(n, 65535));
  ring_gather_kernel<<<grid, kElementwiseThreads>>>(
      d_.index.as<std::int64_t>(), n, scratch_first, d_.pool.as<std::uint8_t>(), slots_,
      spec_.track_tags ? d_.tags.as<Tag>() : nullptr, d_.scratch.as<std::uint8_t>(), scratch_rows_,
      d_.scratch_tags.as<Tag>(), d_.scratch_origin.as<std::int64_t>(), layout_.slot_bytes);
  KVCHECK_CUDA_TRY("launch ring_gather_kernel", cudaGetLastError());
  return sync("load (device sync)");
}

Status CudaBackend::scratch_store(std::int64_t scratch_first, std::span<const std::int64_t> origin_slots,
                                  std::span<const std::int64_t> rope_positions, const double* k,
                                  const double* v, std::span<const Tag> tags) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto rows = static_cast<std::int64_t>(origin_slots.size());
  if (auto st = check_scratch_store(bounds(), scratch_first, origin_slots, tags); !st.ok()) return st;
  if (auto st = stage_rows(rows, rope_positions, k, v); !st.ok()) return st;
  if (rows == 0) return {};
  KVCHECK_CUDA_TRY("cudaMemcpy(origins)", cudaMemcpy(d_.slots.as<void>(), origin_slots.data(),
                                                     origin_slots.size_bytes(), cudaMemcpyHostToDevice));
  const bool track = spec_.track_tags;
  if (track) {
    KVCHECK_CUDA_TRY("cudaMemcpy(tags)", cudaMemcpy(d_.tags_in.as<void>(), tags.data(), tags.size_bytes(),
                                                    cudaMemcpyHostToDevice));
  }
  if (auto st =
          encode_rows(rows, d_.scratch.as<std::uint8_t>(), nullptr, scratch_first, scratch_rows_, nullptr);
      !st.ok()) {
    return st;
  }
  ring_write_row_meta_kernel<<<ring_grid(rows), kElementwiseThreads>>>(
      rows, nullptr, scratch_first, scratch_rows_, nullptr, track ? d_.tags_in.as<Tag>() : nullptr,
      track ? d_.scratch_tags.as<Tag>() : nullptr, d_.slots.as<std::int64_t>(),
      d_.scratch_origin.as<std::int64_t>());
  KVCHECK_CUDA_TRY("launch ring_write_row_meta_kernel", cudaGetLastError());
  return sync("scratch_store (device sync)");
}

Status CudaBackend::attend(KvSource source, std::span<const std::int64_t> rope_positions, const double* q,
                           std::span<const std::int64_t> index, std::int64_t width, double* out,
                           Tag* read_tags, std::int64_t* read_slots) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto n = static_cast<std::int64_t>(rope_positions.size());
  if (auto st = check_attend(bounds(), source, rope_positions, q, index, width); !st.ok()) return st;
  const bool scratch = source == KvSource::kScratch;
  const std::int64_t limit = scratch ? scratch_rows_ : slots_;
  const std::int64_t qn = n * spec_.q_heads * spec_.head_dim;
  if (n == 0) return {};
  const auto total = static_cast<std::int64_t>(index.size());
  KVCHECK_CUDA_TRY("cudaMemcpy(positions)", cudaMemcpy(d_.positions.as<void>(), rope_positions.data(),
                                                       rope_positions.size_bytes(), cudaMemcpyHostToDevice));
  KVCHECK_CUDA_TRY("cudaMemcpy(q)",
                   cudaMemcpy(d_.q_in.as<void>(), q, static_cast<std::size_t>(qn) * sizeof(double),
                              cudaMemcpyHostToDevice));
  if (total > 0) {
    KVCHECK_CUDA_TRY("cudaMemcpy(index)", cudaMemcpy(d_.index.as<void>(), index.data(), index.size_bytes(),
                                                     cudaMemcpyHostToDevice));
  }
  const std::uint8_t* rows = scratch ? d_.scratch.as<std::uint8_t>() : d_.pool.as<std::uint8_t>();
  const double inf = std::numeric_limits<double>::infinity();
  // The float path scales the rotated query in double before narrowing it,
  // as the CPU backend does; the f64 path scales each dot product.
  auto run = [&](auto format_tag) -> Status {
    constexpr ElementFormat F = decltype(format_tag)::value;
    using Acc = RingAccT<F>;
    const bool f64 = F == ElementFormat::kF64;
    ring_rotate_rows_kernel<Acc><<<ring_grid(qn), kElementwiseThreads>>>(
        d_.q_in.as<double>(), n, spec_.q_heads, spec_.head_dim, d_.positions.as<std::int64_t>(), rope_, true,
        f64 ? 1.0 : scale_, inf, nullptr, d_.q_rot.as<Acc>());
    KVCHECK_CUDA_TRY("launch ring_rotate_rows_kernel(q)", cudaGetLastError());
    AttendArgs<Acc> a;
    a.q = d_.q_rot.as<Acc>();
    a.index = d_.index.as<std::int64_t>();
    a.rows = rows;
    a.row_count = limit;
    a.n = n;
    a.width = width;
    a.q_heads = spec_.q_heads;
    a.layout = layout_;
    a.scale = f64 ? static_cast<Acc>(scale_) : Acc(1);
    a.has_sink = spec_.has_sink;
    a.sink = static_cast<Acc>(spec_.sink_logit);
    a.part_acc = d_.part_acc.as<Acc>();
    a.part_ml = d_.part_ml.as<Acc>();
    a.out = d_.out.as<double>();
    a.counters = d_.counters.as<unsigned int>();
    // One decision (impl/cuda/attend_dispatch.hpp), the one attend_paths_run predicts.
    // The workspace holds splits_cap_ splits of max_step_rows queries: this
    // launch's n queries may use as many more as that leaves room for.
    const AttendDispatch dispatch =
        ring_attend_dispatch_of<F>(a, device_, attend_launch_max_splits(splits_cap_, spec_.max_step_rows, n));
    a.splits = dispatch.splits;
    const auto paths = attend_paths_of(dispatch);
    for (std::size_t i = 0; i < paths.size(); ++i) launched_[i] += paths[i] ? 1 : 0;
    return device_status("launch ring_attend", ring_attend_launch<F>(a, dispatch.kernel, nullptr));
  };
  Status st;
  switch (spec_.format) {
    case ElementFormat::kF64: st = run(std::integral_constant<ElementFormat, ElementFormat::kF64>{}); break;
    case ElementFormat::kF32: st = run(std::integral_constant<ElementFormat, ElementFormat::kF32>{}); break;
    case ElementFormat::kBf16: st = run(std::integral_constant<ElementFormat, ElementFormat::kBf16>{}); break;
    case ElementFormat::kFp8: st = run(std::integral_constant<ElementFormat, ElementFormat::kFp8>{}); break;
  }
  if (!st.ok()) return st;
  const bool track = spec_.track_tags && read_tags != nullptr && read_slots != nullptr;
  if (track && total > 0) {
    ring_read_tags_kernel<<<ring_grid(total), kElementwiseThreads>>>(
        d_.index.as<std::int64_t>(), total, limit, scratch ? d_.scratch_tags.as<Tag>() : d_.tags.as<Tag>(),
        scratch ? d_.scratch_origin.as<std::int64_t>() : nullptr, d_.read_tags.as<Tag>(),
        d_.read_slots.as<std::int64_t>());
    KVCHECK_CUDA_TRY("launch ring_read_tags_kernel", cudaGetLastError());
  }
  KVCHECK_CUDA_TRY("cudaMemcpy(out)",
                   cudaMemcpy(out, d_.out.as<void>(), static_cast<std::size_t>(qn) * sizeof(double),
                              cudaMemcpyDeviceToHost));
  if (track && total > 0) {
    KVCHECK_CUDA_TRY("cudaMemcpy(read tags)",
                     cudaMemcpy(read_tags, d_.read_tags.as<void>(),
                                static_cast<std::size_t>(total) * sizeof(Tag), cudaMemcpyDeviceToHost));
    KVCHECK_CUDA_TRY(
        "cudaMemcpy(read slots)",
        cudaMemcpy(read_slots, d_.read_slots.as<void>(),
                   static_cast<std::size_t>(total) * sizeof(std::int64_t), cudaMemcpyDeviceToHost));
  }
  return {};
}

Tag CudaBackend::slot_tag(std::int64_t slot) const {
  // The CPU backend asserts here; a device backend answers an empty tag for
  // a bad slot or a failed copy instead of aborting the checker.
  if (!configured_ || !spec_.track_tags || slot < 0 || slot >= slots_) return Tag{};
  Tag tag;
  if (cudaMemcpy(&tag, d_.tags.as<Tag>() + slot, sizeof(Tag), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return Tag{};
  }
  return tag;
}

Status CudaBackend::fetch_slot(std::int64_t slot, const char* what) const {
  if (auto st = check_configured(); !st.ok()) return st;
  if (slot < 0 || slot >= slots_)
    return Status::fail(CacheError::kSlotOutOfRange, std::string(what) + ": slot outside the pool");
  KVCHECK_CUDA_TRY("cudaMemcpy(read_row)",
                   cudaMemcpy(host_slot_.data(), d_.pool.as<std::uint8_t>() + slot * layout_.slot_bytes,
                              host_slot_.size(), cudaMemcpyDeviceToHost));
  return {};
}

Status CudaBackend::read_row(std::int64_t slot, double* key, double* value) const {
  if (auto st = fetch_slot(slot, "read_row"); !st.ok()) return st;
  // Host decode through the same row codec as the CPU backend.
  const std::int64_t n = layout_.row_elements;
  auto decode = [&](const std::uint8_t* row, double* dst) { decode_row(spec_.format, row, n, dst); };
  decode(host_slot_.data(), key);
  decode(host_slot_.data() + (spec_.shared_row ? 0 : layout_.row_bytes), value);
  return {};
}

// The slot's bytes exactly as the device stored them (the CPU backend's
// layout, impl/element_format.hpp): judged bit for bit like the CPU pool's.
Status CudaBackend::read_row_bytes(std::int64_t slot, std::uint8_t* key, std::uint8_t* value) const {
  if (key == nullptr || value == nullptr)
    return Status::fail(CacheError::kBadArgument, "read_row_bytes: null row");
  if (auto st = fetch_slot(slot, "read_row_bytes"); !st.ok()) return st;
  const auto bytes = static_cast<std::size_t>(layout_.row_bytes);
  std::memcpy(key, host_slot_.data(), bytes);
  std::memcpy(value, host_slot_.data() + (spec_.shared_row ? 0 : bytes), bytes);
  return {};
}

std::vector<std::string> CudaBackend::attend_paths() const {
  std::vector<std::string> names;
  for (int i = 0; i < kAttendPathCount; ++i) names.emplace_back(attend_path_name(static_cast<AttendPath>(i)));
  return names;
}

/// The device the dispatch of an unconfigured backend reads: device 0,
/// queried once per process (a configured one read the same in configure).
const AttendDevice& process_attend_device() {
  static const AttendDevice device = [] {
    int sms = 1;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess || sms < 1) {
      (void)cudaGetLastError();
      sms = 1;
    }
    return ring_attend_device(sms);
  }();
  return device;
}

std::vector<bool> CudaBackend::attend_paths_run(const PoolSpec& spec,
                                                std::span<const std::int64_t> step_queries) const {
  return pool_attend_paths(spec, step_queries, configured_ ? device_ : process_attend_device());
}

std::vector<std::int64_t> CudaBackend::attend_paths_launched() const {
  return std::vector<std::int64_t>(launched_.begin(), launched_.end());
}

}  // namespace
}  // namespace cuda

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the (non-sticky) error for later calls
    if (why) {
      *why = std::string("no CUDA device: cudaGetDeviceCount failed with ") + cudaGetErrorName(err) + " (" +
             cudaGetErrorString(err) + ")";
    }
    return false;
  }
  if (count <= 0) {
    if (why) *why = "no CUDA device: cudaGetDeviceCount found 0 devices";
    return false;
  }
  return true;
}

std::unique_ptr<KvBackend> make_cuda_backend(std::string* why) {
  if (!cuda_device_available(why)) return nullptr;
  return std::make_unique<cuda::CudaBackend>();
}

}  // namespace kvcheck::impl
