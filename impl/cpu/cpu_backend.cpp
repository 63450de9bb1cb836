// CpuBackend: the kernel table's bookkeeping (configure, store, load, reads) and the f64 attention path, which runs in two
// passes in double (scores, then a weighted sum of values). f32, bf16 and fp8
// pools (the production kernel) decode to float and run one of the float
// kernels of float_kernel.hpp per query: the AVX-512 block kernel
// (float_attend_avx512.cpp) when it fits the pool and the CPU, else the
// portable one (float_attend_portable.cpp). Tag work is a template parameter
// of the attention loop, so a pool with tracking off runs a loop with no tag
// code in it.
#include "impl/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "impl/cpu/float_kernel.hpp"
#include "impl/element_format.hpp"
#include "impl/kernel_checks.hpp"
#include "impl/ring_index.hpp"
#include "impl/row_codec.hpp"
#include "support/assert.hpp"

namespace kvcheck::impl::cpu {

namespace {

/// Padding between slots whose size is a multiple of 4 KiB (see configure()).
constexpr std::int64_t kSlotPadBytes = 64;

// Largest magnitude a non-f64 row may hold after RoPE: 2^126 keeps bf16
// rounding and fp8 dequantization (448 * 2^119 at most) inside float range.
constexpr double kFloatRowLimit = 0x1.0p126;

bool mul_overflows(std::int64_t a, std::int64_t b, std::int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

bool CpuBackend::supports(const PoolSpec& spec, std::string* why) const {
  // Every valid spec: the CPU backend has no limits of its own.
  const Status valid = validate_pool_spec(spec);
  if (!valid.ok() && why) *why = valid.detail;
  return valid.ok();
}

Status CpuBackend::configure(const PoolSpec& spec) {
  if (auto st = validate_pool_spec(spec); !st.ok()) return st;
  const std::int64_t keys = ring_window_keys(spec.window_keys, spec.fault);
  std::int64_t slots = 0, row_elements = 0, pool_bytes = 0, q_elements = 0, width_elements = 0;
  const std::int64_t row_bytes =
      format_row_bytes(spec.format, static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim);
  const std::int64_t slot_bytes = spec.shared_row ? row_bytes : 2 * row_bytes;
  // Slots whose size is a multiple of 4 KiB (f32 and bf16 rows of 1024
  // elements, f64) are spaced one cache line further apart, so the rows of a
  // block do not all start at the same page offset (measured: bf16 decode
  // over a DRAM-resident batch ~0.60 -> ~0.68 of a streaming read). The
  // padding bytes stay zero: no kernel writes or reads them.
  std::int64_t slot_stride = slot_bytes;
  if (slot_bytes > 0 && slot_bytes % 4096 == 0 &&
      __builtin_add_overflow(slot_bytes, kSlotPadBytes, &slot_stride)) {
    return Status::fail(CacheError::kSizeOverflow, "pool size overflows");
  }
  const std::int64_t scratch_rows = keys + spec.max_step_rows;
  std::int64_t scratch_bytes = 0, staging_bytes = 0;
  slots = pool_slot_count(spec);
  if (mul_overflows(spec.kv_heads, spec.head_dim, &row_elements) ||
      mul_overflows(slots, slot_stride, &pool_bytes) ||
      mul_overflows(scratch_rows, slot_stride, &scratch_bytes) ||
      mul_overflows(spec.max_step_rows, slot_bytes, &staging_bytes) ||
      mul_overflows(spec.q_heads, spec.head_dim, &q_elements) ||
      mul_overflows(spec.q_heads, scratch_rows, &width_elements) ||
      static_cast<std::uint64_t>(pool_bytes) > std::numeric_limits<std::size_t>::max() / 2) {
    return Status::fail(CacheError::kSizeOverflow, "pool size overflows");
  }
  try {
    PoolSpec s = spec;
    std::vector<std::uint8_t> pool(static_cast<std::size_t>(pool_bytes), 0);
    std::vector<Tag> tags(spec.track_tags ? static_cast<std::size_t>(slots) : 0);
    std::vector<std::uint8_t> scratch(static_cast<std::size_t>(scratch_bytes), 0);
    std::vector<Tag> scratch_tags(static_cast<std::size_t>(scratch_rows));
    std::vector<std::int64_t> scratch_origin(static_cast<std::size_t>(scratch_rows), -1);
    std::vector<std::uint8_t> staging(static_cast<std::size_t>(staging_bytes), 0);
    std::vector<std::uint64_t> stamp(static_cast<std::size_t>(slots), 0);
    pool_ = std::move(pool);
    tags_ = std::move(tags);
    scratch_ = std::move(scratch);
    scratch_tags_ = std::move(scratch_tags);
    scratch_origin_ = std::move(scratch_origin);
    staging_ = std::move(staging);
    stamp_ = std::move(stamp);
    rotated_.assign(static_cast<std::size_t>(row_elements), 0.0);
    decoded_.assign(static_cast<std::size_t>(row_elements), 0.0);
    q_rot_.assign(static_cast<std::size_t>(q_elements), 0.0);
    acc_.assign(static_cast<std::size_t>(q_elements), 0.0);
    if (spec.format == ElementFormat::kF64) {
      scores_.assign(static_cast<std::size_t>(width_elements), 0.0);
      q_f32_.clear();
      acc_f32_.clear();
      softmax_f32_.clear();
    } else {
      // Float kernel rows are padded to whole 16-lane chunks (zeros past head_dim).
      const std::int64_t stride = (std::int64_t{spec.head_dim} + 15) / 16 * 16;
      q_f32_.assign(static_cast<std::size_t>(spec.q_heads * stride), 0.0f);
      acc_f32_.assign(static_cast<std::size_t>(spec.q_heads * stride), 0.0f);
      softmax_f32_.assign(static_cast<std::size_t>(2 * spec.q_heads), 0.0f);
      scores_.clear();
    }
    inv_freq_.clear();
    if (spec.rope_style != RopeStyle::kNone && spec.rope_dims > 0) {
      for (std::int32_t i = 0; i < spec.rope_dims / 2; ++i) {
        inv_freq_.push_back(std::pow(spec.rope_base, -2.0 * i / spec.rope_dims));
      }
    }
    spec_ = s;
  } catch (const std::bad_alloc&) {
    return Status::fail(CacheError::kAllocation, "pool allocation failed");
  }
  slots_ = slots;
  row_elements_ = row_elements;
  row_bytes_ = row_bytes;
  slot_bytes_ = slot_bytes;
  slot_stride_ = slot_stride;
  scratch_rows_ = scratch_rows;
  epoch_ = 0;
  scale_f64_ = spec.softmax_scale > 0.0 ? spec.softmax_scale : 1.0 / std::sqrt(double(spec.head_dim));
  scale_ = static_cast<float>(scale_f64_);
  fast_kernel_ = fast_kernel_fits(spec, row_elements);
  configured_ = true;
  return {};
}

Status CpuBackend::check_configured() const {
  if (!configured_) return Status::fail(CacheError::kUnsupported, "backend not configured");
  return {};
}

KernelBounds CpuBackend::bounds() const {
  return KernelBounds{slots_,
                      scratch_rows_,
                      spec_.max_step_rows,
                      scratch_rows_,
                      static_cast<std::int64_t>(spec_.q_heads) * spec_.head_dim,
                      spec_.track_tags};
}

void CpuBackend::rotate(double* head, std::int64_t position) const {
  if (inv_freq_.empty()) return;
  const std::int32_t half = spec_.rope_dims / 2;
  const bool neox = spec_.rope_style == RopeStyle::kNeox;
  for (std::int32_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq_[static_cast<std::size_t>(i)];
    const double c = std::cos(angle), s = std::sin(angle);
    const std::int32_t a = neox ? i : 2 * i;
    const std::int32_t b = neox ? i + half : 2 * i + 1;
    const double x = head[a], y = head[b];
    head[a] = x * c - y * s;
    head[b] = x * s + y * c;
  }
}

Status CpuBackend::stage_rows(std::int64_t rows, std::span<const std::int64_t> rope_positions,
                              const double* k, const double* v) {
  if (rows > spec_.max_step_rows)
    return Status::fail(CacheError::kTooManyRows, "more rows than max_step_rows");
  if (static_cast<std::int64_t>(rope_positions.size()) != rows) {
    return Status::fail(CacheError::kBadArgument, "rope_positions size != rows");
  }
  if (rows > 0 && (k == nullptr || (!spec_.shared_row && v == nullptr))) {
    return Status::fail(CacheError::kBadArgument, "missing key or value rows");
  }
  const std::int64_t n = rows * row_elements_;
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(k[i]) || (!spec_.shared_row && !std::isfinite(v[i]))) {
      return Status::fail(CacheError::kNonFinite, "non-finite key or value element");
    }
  }
  for (auto p : rope_positions) {
    if (p < 0) return Status::fail(CacheError::kNegativePosition, "negative rope position");
  }
  const double limit =
      spec_.format == ElementFormat::kF64 ? std::numeric_limits<double>::max() : kFloatRowLimit;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::uint8_t* dst = staging_.data() + r * slot_bytes_;
    const double* src = k + r * row_elements_;
    std::copy(src, src + row_elements_, rotated_.begin());
    for (std::int32_t h = 0; h < spec_.kv_heads; ++h) {
      rotate(rotated_.data() + static_cast<std::int64_t>(h) * spec_.head_dim,
             rope_positions[static_cast<std::size_t>(r)]);
    }
    for (double x : rotated_) {
      if (!(std::fabs(x) <= limit)) {
        return Status::fail(CacheError::kNonFinite, "key row leaves the element format's range");
      }
    }
    encode_row(spec_.format, rotated_.data(), row_elements_, dst);
    if (!spec_.shared_row) {
      const double* vs = v + r * row_elements_;
      for (std::int64_t i = 0; i < row_elements_; ++i) {
        if (!(std::fabs(vs[i]) <= limit)) {
          return Status::fail(CacheError::kNonFinite, "value row leaves the element format's range");
        }
      }
      encode_row(spec_.format, vs, row_elements_, dst + row_bytes_);
    }
  }
  return {};
}

Status CpuBackend::store(std::span<const std::int64_t> slots, std::span<const std::int64_t> rope_positions,
                         const double* k, const double* v, std::span<const Tag> tags, StoreReport* report) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto rows = static_cast<std::int64_t>(slots.size());
  if (auto st = check_store(bounds(), slots, tags); !st.ok()) return st;
  if (auto st = stage_rows(rows, rope_positions, k, v); !st.ok()) return st;
  // Commit: nothing below can fail.
  ++epoch_;
  std::int64_t duplicates = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto slot = static_cast<std::size_t>(slots[static_cast<std::size_t>(r)]);
    // stamp == 2*epoch: written once in this call; 2*epoch + 1: counted duplicate.
    if (stamp_[slot] == 2 * epoch_) {
      stamp_[slot] = 2 * epoch_ + 1;
      ++duplicates;
    } else if (stamp_[slot] != 2 * epoch_ + 1) {
      stamp_[slot] = 2 * epoch_;
    }
    std::memcpy(pool_.data() + slot * static_cast<std::size_t>(slot_stride_),
                staging_.data() + r * slot_bytes_, static_cast<std::size_t>(slot_bytes_));
    if (spec_.track_tags) tags_[slot] = tags[static_cast<std::size_t>(r)];
  }
  if (report) report->duplicate_slots = duplicates;
  return {};
}

Status CpuBackend::load(std::span<const std::int64_t> index, std::int64_t scratch_first) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto n = static_cast<std::int64_t>(index.size());
  if (auto st = check_load(bounds(), index, scratch_first); !st.ok()) return st;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t s = index[static_cast<std::size_t>(i)];
    const auto row = static_cast<std::size_t>(scratch_first + i);
    scratch_origin_[row] = s;
    if (s < 0) {
      scratch_tags_[row] = Tag{};
      continue;
    }
    std::memcpy(scratch_.data() + row * static_cast<std::size_t>(slot_stride_),
                pool_.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(slot_stride_),
                static_cast<std::size_t>(slot_bytes_));
    if (spec_.track_tags) scratch_tags_[row] = tags_[static_cast<std::size_t>(s)];
  }
  return {};
}

Status CpuBackend::scratch_store(std::int64_t scratch_first, std::span<const std::int64_t> origin_slots,
                                 std::span<const std::int64_t> rope_positions, const double* k,
                                 const double* v, std::span<const Tag> tags) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto rows = static_cast<std::int64_t>(origin_slots.size());
  if (auto st = check_scratch_store(bounds(), scratch_first, origin_slots, tags); !st.ok()) return st;
  if (auto st = stage_rows(rows, rope_positions, k, v); !st.ok()) return st;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>(scratch_first + r);
    std::memcpy(scratch_.data() + row * static_cast<std::size_t>(slot_stride_),
                staging_.data() + r * slot_bytes_, static_cast<std::size_t>(slot_bytes_));
    scratch_origin_[row] = origin_slots[static_cast<std::size_t>(r)];
    if (spec_.track_tags) scratch_tags_[row] = tags[static_cast<std::size_t>(r)];
  }
  return {};
}

Status CpuBackend::attend(KvSource source, std::span<const std::int64_t> rope_positions, const double* q,
                          std::span<const std::int64_t> index, std::int64_t width, double* out,
                          Tag* read_tags, std::int64_t* read_slots) {
  if (auto st = check_configured(); !st.ok()) return st;
  if (auto st = check_attend(bounds(), source, rope_positions, q, index, width); !st.ok()) return st;
  const bool scratch = source == KvSource::kScratch;
  const std::uint8_t* base = scratch ? scratch_.data() : pool_.data();
  const Tag* tags = scratch ? scratch_tags_.data() : tags_.data();
  const std::int64_t* origins = scratch ? scratch_origin_.data() : nullptr;
  if (spec_.track_tags && read_tags != nullptr && read_slots != nullptr) {
    attend_rows<true>(base, tags, origins, scratch, rope_positions, q, index, width, out, read_tags,
                      read_slots);
  } else {
    attend_rows<false>(base, tags, origins, scratch, rope_positions, q, index, width, out, nullptr, nullptr);
  }
  return {};
}

template <bool kTrack>
void CpuBackend::attend_rows(const std::uint8_t* base, const Tag* tags, const std::int64_t* origins,
                             bool from_scratch, std::span<const std::int64_t> rope_positions, const double* q,
                             std::span<const std::int64_t> index, std::int64_t width, double* out,
                             Tag* read_tags, std::int64_t* read_slots) {
  const std::int64_t hd = spec_.head_dim;
  const std::int64_t qh = spec_.q_heads;
  const std::int64_t group = qh / spec_.kv_heads;
  const std::int64_t qe = qh * hd;
  const bool f64 = spec_.format == ElementFormat::kF64;
  const std::int64_t value_offset = spec_.shared_row ? 0 : row_bytes_;
  const std::int64_t n = static_cast<std::int64_t>(rope_positions.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t* idx = index.data() + i * width;
    if constexpr (kTrack) {
      for (std::int64_t c = 0; c < width; ++c) {
        const std::int64_t e = idx[c];
        read_slots[i * width + c] = e < 0 ? -1 : (from_scratch ? origins[e] : e);
        read_tags[i * width + c] = e < 0 ? Tag{} : tags[e];
      }
    } else {
      (void)tags;
      (void)origins;
      (void)from_scratch;
    }
    // Rotate the query heads in double.
    std::copy(q + i * qe, q + (i + 1) * qe, q_rot_.begin());
    for (std::int64_t h = 0; h < qh; ++h)
      rotate(q_rot_.data() + h * hd, rope_positions[static_cast<std::size_t>(i)]);
    double* o = out + i * qe;
    if (f64) {
      // scores_: [q_heads, width]; -inf marks a skipped column.
      for (std::int64_t c = 0; c < width; ++c) {
        const std::int64_t e = idx[c];
        for (std::int64_t h = 0; h < qh; ++h) {
          double s = -std::numeric_limits<double>::infinity();
          if (e >= 0) {
            const auto* key =
                std::launder(reinterpret_cast<const double*>(base + e * slot_stride_)) + (h / group) * hd;
            const double* qv = q_rot_.data() + h * hd;
            double d = 0;
            for (std::int64_t x = 0; x < hd; ++x) d += qv[x] * key[x];
            s = d * scale_f64_;
          }
          scores_[static_cast<std::size_t>(h * width + c)] = s;
        }
      }
      std::fill(acc_.begin(), acc_.end(), 0.0);
      for (std::int64_t h = 0; h < qh; ++h) {
        double* sc = scores_.data() + h * width;
        double m = spec_.has_sink ? spec_.sink_logit : -std::numeric_limits<double>::infinity();
        for (std::int64_t c = 0; c < width; ++c) m = std::max(m, sc[c]);
        double total = spec_.has_sink ? std::exp(spec_.sink_logit - m) : 0.0;
        for (std::int64_t c = 0; c < width; ++c) {
          sc[c] = idx[c] < 0 ? 0.0 : std::exp(sc[c] - m);
          total += sc[c];
        }
        const double inv = total > 0 ? 1.0 / total : 0.0;
        for (std::int64_t c = 0; c < width; ++c) sc[c] *= inv;
      }
      for (std::int64_t c = 0; c < width; ++c) {
        const std::int64_t e = idx[c];
        if (e < 0) continue;
        const auto* val =
            std::launder(reinterpret_cast<const double*>(base + e * slot_stride_ + value_offset));
        for (std::int64_t h = 0; h < qh; ++h) {
          const double w = scores_[static_cast<std::size_t>(h * width + c)];
          const double* vv = val + (h / group) * hd;
          double* a = acc_.data() + h * hd;
          for (std::int64_t x = 0; x < hd; ++x) a[x] += w * vv[x];
        }
      }
      std::copy(acc_.begin(), acc_.end(), o);
      continue;
    }
    // Float path: [q_heads, hs] query and accumulators, padded with zeros.
    const std::int64_t hs = static_cast<std::int64_t>(q_f32_.size()) / qh;
    for (std::int64_t h = 0; h < qh; ++h) {
      for (std::int64_t x = 0; x < hd; ++x) {
        q_f32_[static_cast<std::size_t>(h * hs + x)] =
            static_cast<float>(q_rot_[static_cast<std::size_t>(h * hd + x)] * scale_f64_);
      }
    }
    const FloatJob job{spec_.format,
                       base,
                       slot_bytes_,
                       slot_stride_,
                       value_offset,
                       row_elements_,
                       hd,
                       hs,
                       qh,
                       group,
                       width,
                       idx,
                       q_f32_.data(),
                       acc_f32_.data(),
                       softmax_f32_.data(),
                       spec_.has_sink,
                       static_cast<float>(spec_.sink_logit)};
    if (fast_kernel_) {
      attend_query_avx512(job);
    } else {
      attend_query_portable(job);
    }
    for (std::int64_t h = 0; h < qh; ++h) {
      for (std::int64_t x = 0; x < hd; ++x) o[h * hd + x] = acc_f32_[static_cast<std::size_t>(h * hs + x)];
    }
  }
}

Tag CpuBackend::slot_tag(std::int64_t slot) const {
  KVCHECK_ASSERT(configured_ && slot >= 0 && slot < slots_);
  if (!spec_.track_tags) return Tag{};
  return tags_[static_cast<std::size_t>(slot)];
}

Status CpuBackend::read_row(std::int64_t slot, double* key, double* value) const {
  if (auto st = check_configured(); !st.ok()) return st;
  if (slot < 0 || slot >= slots_)
    return Status::fail(CacheError::kSlotOutOfRange, "read_row: slot outside the pool");
  const std::uint8_t* row = pool_.data() + slot * slot_stride_;
  decode_row(spec_.format, row, row_elements_, key);
  decode_row(spec_.format, row + (spec_.shared_row ? 0 : row_bytes_), row_elements_, value);
  return {};
}

Status CpuBackend::read_row_bytes(std::int64_t slot, std::uint8_t* key, std::uint8_t* value) const {
  if (auto st = check_configured(); !st.ok()) return st;
  if (slot < 0 || slot >= slots_)
    return Status::fail(CacheError::kSlotOutOfRange, "read_row_bytes: slot outside the pool");
  const std::uint8_t* row = pool_.data() + slot * slot_stride_;
  std::memcpy(key, row, static_cast<std::size_t>(row_bytes_));
  std::memcpy(value, row + (spec_.shared_row ? 0 : row_bytes_), static_cast<std::size_t>(row_bytes_));
  return {};
}

}  // namespace kvcheck::impl::cpu
