// Names, format helpers and the backend factory of impl/kv_cache.hpp.
#include "impl/kv_cache.hpp"

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "impl/cpu/cpu_backend.hpp"
#include "impl/element_format.hpp"
#include "impl/ring_index.hpp"
#include "impl/row_codec.hpp"
#include "support/assert.hpp"

#if KVCHECK_HAVE_CUDA
#include "impl/cuda/cuda_backend.hpp"
#endif

namespace kvcheck::impl {

namespace {

struct FaultInfo {
  Fault fault;
  std::string_view name;
  std::string_view description;
};

// Indexed by the enum value: both come from the one KVCHECK_FAULTS list.
constexpr std::array<FaultInfo, kFaultCount> kFaults = {{
#define KVCHECK_FAULT_ROW(id, name, description) {Fault::id, name, description},
    KVCHECK_FAULTS(KVCHECK_FAULT_ROW)
#undef KVCHECK_FAULT_ROW
}};

bool mul_overflows(std::int64_t a, std::int64_t b, std::int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

Status KvBackend::read_row_bytes(std::int64_t, std::uint8_t*, std::uint8_t*) const {
  return Status::fail(CacheError::kUnsupported, std::string(name()) + " does not report encoded rows");
}

std::vector<std::string> KvBackend::attend_paths() const {
  return {};
}

std::vector<bool> KvBackend::attend_paths_run(const PoolSpec&, std::span<const std::int64_t>) const {
  return {};
}

std::vector<std::int64_t> KvBackend::attend_paths_launched() const {
  return {};
}

std::string_view fault_name(Fault fault) noexcept {
  const auto i = static_cast<std::size_t>(fault);
  return i < kFaults.size() ? kFaults[i].name : std::string_view("?");
}

std::string_view fault_description(Fault fault) noexcept {
  const auto i = static_cast<std::size_t>(fault);
  return i < kFaults.size() ? kFaults[i].description : std::string_view("?");
}

bool parse_fault(std::string_view name, Fault* out) noexcept {
  for (const auto& f : kFaults) {
    if (f.name == name) {
      *out = f.fault;
      return true;
    }
  }
  return false;
}

void format_round_trip(ElementFormat format, const double* in, double* out, std::int64_t n) {
  // Through the bytes a cache stores: the same encoder and decoder as the
  // CPU backend's store and read_row.
  std::vector<std::uint8_t> row(static_cast<std::size_t>(format_row_bytes(format, n)));
  encode_row(format, in, n, row.data());
  decode_row(format, row.data(), n, out);
}

std::string_view cache_error_name(CacheError error) noexcept {
  switch (error) {
    case CacheError::kOk: return "ok";
    case CacheError::kZeroRing: return "zero-ring";
    case CacheError::kZeroShape: return "zero-shape";
    case CacheError::kSizeOverflow: return "size-overflow";
    case CacheError::kAllocation: return "allocation";
    case CacheError::kStateOutOfRange: return "state-out-of-range";
    case CacheError::kStateBusy: return "state-busy";
    case CacheError::kStateFree: return "state-free";
    case CacheError::kTooManyRows: return "too-many-rows";
    case CacheError::kNonFinite: return "non-finite";
    case CacheError::kNegativePosition: return "negative-position";
    case CacheError::kBadAccept: return "bad-accept";
    case CacheError::kUnsupported: return "unsupported";
    case CacheError::kNoDevice: return "no-device";
    case CacheError::kDeviceFailure: return "device-failure";
    case CacheError::kBadSpec: return "bad-spec";
    case CacheError::kSlotOutOfRange: return "slot-out-of-range";
    case CacheError::kBadArgument: return "bad-argument";
  }
  return "?";
}

std::int64_t pool_slot_count(const PoolSpec& spec) noexcept {
  return spec.pool_slots > 0 ? spec.pool_slots : spec.states * spec.ring_rows;
}

Status validate_pool_spec(const PoolSpec& spec) {
  if (spec.states <= 0 || spec.ring_rows <= 0) {
    return Status::fail(CacheError::kZeroRing, "states and ring_rows must be positive");
  }
  if (spec.pool_slots < 0) return Status::fail(CacheError::kZeroRing, "pool_slots must be >= 0");
  if (spec.q_heads <= 0 || spec.kv_heads <= 0 || spec.head_dim <= 0 || spec.window_keys <= 0 ||
      spec.max_step_rows <= 0) {
    return Status::fail(CacheError::kZeroShape,
                        "q_heads, kv_heads, head_dim, window_keys and max_step_rows must be positive");
  }
  if (spec.q_heads % spec.kv_heads != 0) {
    return Status::fail(CacheError::kBadSpec, "q_heads must be a multiple of kv_heads");
  }
  if (spec.max_step_readers < 0 || spec.max_step_readers > spec.max_step_rows) {
    return Status::fail(CacheError::kBadSpec, "max_step_readers must be in [0, max_step_rows]");
  }
  if (spec.shared_row && spec.kv_heads != 1) {
    return Status::fail(CacheError::kBadSpec, "shared rows need kv_heads == 1");
  }
  if (spec.rope_style != RopeStyle::kNone) {
    if (spec.rope_dims < 0 || spec.rope_dims % 2 != 0 || spec.rope_dims > spec.head_dim) {
      return Status::fail(CacheError::kBadSpec, "rope_dims must be even and at most head_dim");
    }
    if (!std::isfinite(spec.rope_base))
      return Status::fail(CacheError::kNonFinite, "rope_base must be finite");
    if (!(spec.rope_base > 0.0)) return Status::fail(CacheError::kBadSpec, "rope_base must be positive");
  }
  if (!std::isfinite(spec.softmax_scale) || (spec.has_sink && !std::isfinite(spec.sink_logit))) {
    return Status::fail(CacheError::kNonFinite, "softmax_scale and sink_logit must be finite");
  }
  if (spec.softmax_scale < 0.0) return Status::fail(CacheError::kBadSpec, "softmax_scale must be >= 0");
  // Every size a pool and its step buffers derive from, on any backend.
  const std::int64_t ring_rows = spec.fault == Fault::kRingSizedWindow ? spec.window_keys : spec.ring_rows;
  const std::int64_t keys = ring_window_keys(spec.window_keys, spec.fault);
  std::int64_t slots = 0, row_elements = 0, pool_bytes = 0, q_elements = 0, out_elements = 0,
               index_elements = 0;
  const bool overflows =
      (spec.pool_slots > 0 ? (slots = spec.pool_slots, false)
                           : mul_overflows(spec.states, ring_rows, &slots)) ||
      mul_overflows(spec.kv_heads, spec.head_dim, &row_elements) ||
      row_elements > std::numeric_limits<std::int64_t>::max() / 16 ||
      mul_overflows(slots, format_row_bytes(spec.format, row_elements) * (spec.shared_row ? 1 : 2),
                    &pool_bytes) ||
      keys > std::numeric_limits<std::int64_t>::max() - spec.max_step_rows ||
      mul_overflows(spec.q_heads, spec.head_dim, &q_elements) ||
      mul_overflows(q_elements, spec.max_step_rows, &out_elements) ||
      mul_overflows(keys + spec.max_step_rows, spec.max_step_rows, &index_elements) ||
      static_cast<std::uint64_t>(pool_bytes) > std::numeric_limits<std::size_t>::max() / 2 ||
      static_cast<std::uint64_t>(index_elements) > (std::uint64_t{1} << 40);
  if (overflows) return Status::fail(CacheError::kSizeOverflow, "pool or step buffer size overflows");
  return {};
}

std::unique_ptr<KvBackend> make_backend(std::string_view name, std::string* why) {
  if (name == "cpu") return std::make_unique<cpu::CpuBackend>();
  if (name == "cuda") {
#if KVCHECK_HAVE_CUDA
    // Hook for the CUDA backend (impl/cuda/cuda_backend.hpp).
    return make_cuda_backend(why);
#else
    if (why) *why = "this build has no CUDA backend (configure with KVCHECK_CUDA=ON and nvcc)";
    return nullptr;
#endif
  }
  if (why) *why = "unknown backend '" + std::string(name) + "' (known: cpu, cuda)";
  return nullptr;
}

}  // namespace kvcheck::impl
