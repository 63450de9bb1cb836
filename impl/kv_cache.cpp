// Names, format helpers and the backend factory of impl/kv_cache.hpp.
#include "impl/kv_cache.hpp"

#include <array>
#include <vector>

#include "impl/cpu/cpu_backend.hpp"
#include "impl/element_format.hpp"
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

// Indexed by the enum value; the order is checked by a test.
constexpr std::array<FaultInfo, kFaultCount> kFaults = {{
    {Fault::kNone, "none", "no fault: the production behaviour"},
    {Fault::kRingSizedWindow, "ring-sized-window",
     "ring allocated with exactly W rows: no slack for verify or chunked prefill"},
    {Fault::kStoreThenLoadPrefill, "store-then-load-prefill",
     "every prefill stores its chunk before reading, whatever order was asked"},
    {Fault::kWindowTooWide, "window-too-wide", "W + 1 keys visible to each query"},
    {Fault::kWindowTooNarrow, "window-too-narrow", "W - 1 keys visible to each query"},
    {Fault::kIndexNoPadding, "index-no-padding",
     "index columns past the valid length hold ring slots instead of -1"},
    {Fault::kSlotNoStateOffset, "slot-no-state-offset",
     "slot = p mod S: the state block offset b*S is dropped"},
    {Fault::kModuloWholePool, "modulo-whole-pool",
     "slot = (b*S + p) mod (states*S) instead of inside the state's block"},
    {Fault::kRopeResidentLength, "rope-resident-length",
     "RoPE at the resident length min(p, S) instead of the absolute position p"},
    {Fault::kAcceptNoRollback, "accept-no-rollback",
     "accept(a) leaves the logical length after all k drafts"},
    {Fault::kFreedStateReadable, "freed-state-readable",
     "a reused state id reads its old occupant's stale rows"},
}};

}  // namespace

Status KvBackend::read_row_bytes(std::int64_t, std::uint8_t*, std::uint8_t*) const {
  return Status::fail(CacheError::kUnsupported, std::string(name()) + " does not report encoded rows");
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

std::string_view format_name(ElementFormat format) noexcept {
  switch (format) {
    case ElementFormat::kF64: return "f64";
    case ElementFormat::kF32: return "f32";
    case ElementFormat::kBf16: return "bf16";
    case ElementFormat::kFp8E4m3: return "fp8";
  }
  return "?";
}

std::int64_t format_row_bytes(ElementFormat format, std::int64_t elements) noexcept {
  switch (format) {
    case ElementFormat::kF64: return 8 * elements;
    case ElementFormat::kF32: return 4 * elements;
    case ElementFormat::kBf16: return 2 * elements;
    case ElementFormat::kFp8E4m3: return fp8_row_bytes(elements);
  }
  return 0;
}

double format_epsilon(ElementFormat format) noexcept {
  switch (format) {
    case ElementFormat::kF64: return 0x1.0p-53;
    case ElementFormat::kF32: return 0x1.0p-24;
    case ElementFormat::kBf16: return 0x1.0p-8;
    case ElementFormat::kFp8E4m3: return 0x1.0p-4;
  }
  return 1.0;
}

void format_round_trip(ElementFormat format, const double* in, double* out, std::int64_t n) {
  switch (format) {
    case ElementFormat::kF64:
      for (std::int64_t i = 0; i < n; ++i) out[i] = in[i];
      return;
    case ElementFormat::kF32:
      for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
      return;
    case ElementFormat::kBf16:
      for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(bf16_from_double(in[i]));
      return;
    case ElementFormat::kFp8E4m3: {
      std::vector<std::uint8_t> row(static_cast<std::size_t>(fp8_row_bytes(n)));
      fp8_encode_row(in, n, row.data());
      fp8_decode_row(row.data(), n, out);
      return;
    }
  }
  KVCHECK_ASSERT(false);
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
  }
  return "?";
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
