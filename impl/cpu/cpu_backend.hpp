// CpuBackend: the production CPU implementation of the KvBackend kernel table
// (impl/kv_cache.hpp). One contiguous pool of pool_slot_count(spec) slots (spaced
// slot_stride() apart: 4 KiB-multiple slots get 64 zero padding bytes), each
// slot a key row followed by a value row (or one shared row) in the pool's
// element format, with a Tag array beside it. All buffers are allocated in
// configure(); no kernel allocates. Every kernel validates all of its inputs
// (and stages quantized rows) before it writes anything, so a refused call
// leaves the pool byte-identical. The kernels take slot lists and index rows
// made from a slot map (impl/slot_map.hpp) and compute no address; format
// math comes from impl/element_format.hpp (shared with CUDA).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "impl/kernel_checks.hpp"
#include "impl/kv_cache.hpp"

namespace kvcheck::impl::cpu {

/// True when this CPU has the AVX-512 subset the block attention kernel needs.
bool fast_kernel_available();
/// True when attention over a pool of `spec` runs the AVX-512 block kernel
/// on this CPU (the dispatch configure() makes): f32/bf16/fp8 rows,
/// head_dim 64/128/256, query heads per KV head a multiple of 4.
bool fast_kernel_runs(const PoolSpec& spec);

/// Production CPU backend (one layer's pool).
class CpuBackend final : public KvBackend {
 public:
  CpuBackend() = default;

  std::string_view name() const noexcept override { return "cpu"; }
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

  /// Bytes of one slot (key row + value row, or one shared row).
  std::int64_t slot_bytes() const noexcept { return slot_bytes_; }
  /// Bytes from one slot's start to the next in the pool (slot_bytes, plus
  /// 64 zero padding bytes when slot_bytes is a multiple of 4 KiB).
  std::int64_t slot_stride() const noexcept { return slot_stride_; }
  /// Raw pool bytes [pool slots, slot_stride] (for byte-identity tests),
  /// padding included.
  std::span<const std::uint8_t> pool_bytes() const noexcept { return pool_; }

 private:
  Status check_configured() const;
  /// The sizes the shared kernel argument checks (impl/kernel_checks.hpp) use.
  KernelBounds bounds() const;
  Status stage_rows(std::int64_t rows, std::span<const std::int64_t> rope_positions, const double* k,
                    const double* v);
  void rotate(double* head, std::int64_t position) const;
  template <bool kTrack>
  void attend_rows(const std::uint8_t* base, const Tag* tags, const std::int64_t* origins, bool from_scratch,
                   std::span<const std::int64_t> rope_positions, const double* q,
                   std::span<const std::int64_t> index, std::int64_t width, double* out, Tag* read_tags,
                   std::int64_t* read_slots);

  PoolSpec spec_;
  bool configured_ = false;
  std::int64_t slots_ = 0;         // pool_slot_count(spec)
  std::int64_t row_elements_ = 0;  // kv_heads * head_dim
  std::int64_t row_bytes_ = 0;     // format_row_bytes(format, row_elements)
  std::int64_t slot_bytes_ = 0;    // row_bytes (shared) or 2 * row_bytes
  std::int64_t slot_stride_ = 0;   // bytes between slots in pool_ and scratch_ (>= slot_bytes_)
  std::int64_t scratch_rows_ = 0;  // window keys + max_step_rows
  float scale_ = 0.0f;
  double scale_f64_ = 0.0;
  std::vector<double> inv_freq_;  // [rope_dims / 2] base^(-2i/rope_dims)

  std::vector<std::uint8_t> pool_;            // [slots, slot_stride]
  std::vector<Tag> tags_;                     // [slots] (empty when not tracking)
  std::vector<std::uint8_t> scratch_;         // [scratch_rows, slot_stride]
  std::vector<Tag> scratch_tags_;             // [scratch_rows]
  std::vector<std::int64_t> scratch_origin_;  // [scratch_rows] pool slot each row represents
  std::vector<std::uint8_t> staging_;         // [max_step_rows, slot_bytes] quantized rows
  std::vector<double> rotated_;               // [kv_heads * head_dim] one key row in flight
  std::vector<double> decoded_;               // [kv_heads * head_dim] one decoded row
  std::vector<std::uint64_t> stamp_;          // [slots] duplicate detection per store call
  std::uint64_t epoch_ = 0;
  // attend workspace
  std::vector<double> q_rot_;   // [q_heads, head_dim]
  std::vector<double> scores_;  // [q_heads, width_max] (f64 path)
  std::vector<double> acc_;     // [q_heads, head_dim] (f64 path)
  // Float path; head_stride = head_dim rounded up to 16 lanes, zeros past head_dim.
  std::vector<float> q_f32_;        // [q_heads, head_stride] RoPE'd, pre-scaled
  std::vector<float> acc_f32_;      // [q_heads, head_stride] online-softmax accumulators
  std::vector<float> softmax_f32_;  // [2, q_heads] running max, running sum
  bool fast_kernel_ = false;        // AVX-512 kernel fits this pool and CPU (configure)
};

}  // namespace kvcheck::impl::cpu
