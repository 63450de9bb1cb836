// The one interface every cache backend implements (CPU now, CUDA beside it).
//
// A backend owns one pool of slots for one layer (pool_slot_count(spec)
// rows), each row stored in an ElementFormat, plus a tag per slot (request,
// position, write sequence) kept beside the data so a checker can see exactly
// what every read returned. It exposes the data kernels an engine runs per
// step: store at a list of slots, load (gather into a scratch "assembled
// input"), and attention over index rows (-1 padded). The kernels compute no
// address: which slot holds (state, position) and which slots a window reads
// is a slot map (impl/slot_map.hpp: a ring, a block table). The step
// semantics (prefill orders, verify, accept, finish, reset) are composed from
// these kernels and a slot map once, in impl/ring_pool.hpp, for every backend.
//
// Nothing here includes model/: the implementations under test never share a
// layout struct with the reference.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support/formats.hpp"

namespace kvcheck::impl {

/// How one cached row is laid out in bytes: the one format type of
/// support/formats.hpp (names, row bytes and unit roundoff come from its
/// table; the byte layout is impl/element_format.hpp).
using ElementFormat = kvcheck::ElementFormat;

/// RoPE pairing of the rotary dimensions.
enum class RopeStyle : std::uint8_t {
  kNone,         ///< no rotation
  kNeox,         ///< pairs (i, i + rotary/2)
  kInterleaved,  ///< pairs (2i, 2i + 1)
};

/// Order of a chunked prefill's store and read.
enum class PrefillOrder : std::uint8_t {
  kLoadThenStore,  ///< copy the old window to scratch, then store (safe)
  kStoreThenLoad,  ///< store the chunk first, then read the pool (the hazard engines ship)
};

/// Deliberate, named faults: each a small change a real engine has shipped.
/// One list makes the enum, the names, the descriptions and kFaultCount, so
/// they cannot drift apart: X(enumerator, name, description).
#define KVCHECK_FAULTS(X)                                                                                \
  X(kNone, "none", "no fault: the production behaviour")                                                 \
  X(kRingSizedWindow, "ring-sized-window",                                                               \
    "ring allocated with exactly W rows: no slack for verify or chunked prefill")                        \
  X(kStoreThenLoadPrefill, "store-then-load-prefill",                                                    \
    "every prefill stores its chunk before reading, whatever order was asked")                           \
  X(kWindowTooWide, "window-too-wide", "W + 1 keys visible to each query")                               \
  X(kWindowTooNarrow, "window-too-narrow", "W - 1 keys visible to each query")                           \
  X(kIndexNoPadding, "index-no-padding",                                                                 \
    "index columns past the valid length hold ring slots instead of -1")                                 \
  X(kSlotNoStateOffset, "slot-no-state-offset", "slot = p mod S: the state block offset b*S is dropped") \
  X(kModuloWholePool, "modulo-whole-pool",                                                               \
    "slot = (b*S + p) mod (states*S) instead of inside the state's block")                               \
  X(kRopeResidentLength, "rope-resident-length",                                                         \
    "RoPE at the resident length min(p, S) instead of the absolute position p")                          \
  X(kAcceptNoRollback, "accept-no-rollback", "accept(a) leaves the logical length after all k drafts")   \
  X(kFreedStateReadable, "freed-state-readable", "a reused state id reads its old occupant's stale rows")

enum class Fault : std::uint8_t {
#define KVCHECK_FAULT_ENUMERATOR(id, name, description) id,
  KVCHECK_FAULTS(KVCHECK_FAULT_ENUMERATOR)
#undef KVCHECK_FAULT_ENUMERATOR
};

/// Number of Fault values (for iteration), counted from the list.
inline constexpr int kFaultCount = 0
#define KVCHECK_FAULT_COUNT(id, name, description) +1
    KVCHECK_FAULTS(KVCHECK_FAULT_COUNT)
#undef KVCHECK_FAULT_COUNT
    ;

/// Name used on the command line and in reports ("none", "ring-sized-window", ...).
std::string_view fault_name(Fault fault) noexcept;
/// One-line description for `kvcheck faults`.
std::string_view fault_description(Fault fault) noexcept;
/// Parses a fault name; returns false when unknown.
bool parse_fault(std::string_view name, Fault* out) noexcept;

// A format's name, row bytes and unit roundoff: format_name,
// format_row_bytes and format_unit_roundoff in support/formats.hpp.
/// Rounds `n` values through the format (fp8 with its per-32 block scale) and back.
void format_round_trip(ElementFormat format, const double* in, double* out, std::int64_t n);

/// Typed refusals (tier 2): the pool is left exactly as it was. Bad data
/// (a state, a position, a row) and a caller's broken call (a null pointer, a
/// span of the wrong length: kBadArgument) have separate codes; a device that
/// fails is kDeviceFailure, never an abort.
enum class CacheError : std::uint8_t {
  kOk,
  kZeroRing,          ///< ring_rows or states is zero
  kZeroShape,         ///< heads, head_dim, window or max_step_rows is zero
  kSizeOverflow,      ///< a product of sizes overflows int64 or size_t
  kAllocation,        ///< the pool could not be allocated
  kStateOutOfRange,   ///< a state id outside [0, states)
  kStateBusy,         ///< begin() on a state that is in use
  kStateFree,         ///< a step on a state with no request
  kTooManyRows,       ///< a step with more rows than max_step_rows
  kNonFinite,         ///< a NaN or Inf in a key, value or query row
  kNegativePosition,  ///< a negative position
  kBadAccept,         ///< accept(a) with a > k or no verify pending
  kUnsupported,       ///< the backend does not support this configuration
  kNoDevice,          ///< CUDA backend with no CUDA device
  kDeviceFailure,     ///< a CUDA call failed
  kBadSpec,           ///< a pool spec field breaks a rule: q_heads not a multiple of
                      ///< kv_heads, shared rows with several KV heads, RoPE width odd or
                      ///< wider than head_dim, RoPE base <= 0, negative softmax scale,
                      ///< max_step_readers outside [0, max_step_rows]
  kSlotOutOfRange,    ///< a pool slot or scratch row outside its buffer, or a position with no slot
  kBadArgument,       ///< a null row pointer or a span whose length does not match the call
};

/// Stable name of a CacheError ("state-out-of-range", ...).
std::string_view cache_error_name(CacheError error) noexcept;

/// Result of a fallible call. `detail` is filled only on failure paths.
struct Status {
  CacheError code = CacheError::kOk;
  std::string detail;
  bool ok() const noexcept { return code == CacheError::kOk; }
  static Status fail(CacheError code, std::string detail) { return {code, std::move(detail)}; }
};

/// What one slot holds. `request < 0` means empty (never written).
struct Tag {
  std::int64_t request = -1;
  std::int64_t position = -1;
  std::uint64_t write_seq = 0;  ///< pool-wide write counter, starts at 1
  bool empty() const noexcept { return request < 0; }
  friend bool operator==(const Tag&, const Tag&) = default;
};

/// Everything a backend needs to allocate one layer's pool.
struct PoolSpec {
  std::int64_t states = 1;       ///< state ids (requests resident at once)
  std::int64_t ring_rows = 0;    ///< S: physical rows per state (the ring's block; a paged pool's reach)
  std::int64_t pool_slots = 0;   ///< slots the kernels allocate; 0: states * ring_rows (the ring)
  std::int64_t window_keys = 0;  ///< W: keys visible to a query, itself included
  std::int32_t q_heads = 1;      ///< query heads
  std::int32_t kv_heads = 1;     ///< stored KV heads (q_heads % kv_heads == 0)
  std::int32_t head_dim = 1;     ///< elements per head
  bool shared_row = false;       ///< MLA-style: one stored row is both key and value (kv_heads == 1)
  ElementFormat format = ElementFormat::kF32;
  RopeStyle rope_style = RopeStyle::kNone;
  std::int32_t rope_dims = 0;  ///< rotary width within head_dim (even; 0 = none)
  double rope_base = 10000.0;
  double softmax_scale = 0.0;  ///< 0 means 1/sqrt(head_dim)
  bool has_sink = false;       ///< add an attention-sink logit to every softmax
  double sink_logit = 0.0;
  std::int64_t max_step_rows = 1;  ///< most rows one step stores or queries
  /// Most queries of one step that read (RingPool's StepReads), which sizes
  /// RingPool's read buffers; 0: max_step_rows. A caller that reads a few
  /// queries of long steps (the capacity sweep) allocates for those.
  std::int64_t max_step_readers = 0;
  bool track_tags = true;  ///< false: tags are neither written nor read
  Fault fault = Fault::kNone;
};

/// Slots of the pool the kernels allocate: pool_slots, or states * ring_rows
/// when it is 0 (the ring's one block per state). Assumes a valid spec.
std::int64_t pool_slot_count(const PoolSpec& spec) noexcept;

/// The rules every pool spec obeys, whatever the backend: positive sizes
/// (kZeroRing, kZeroShape; pool_slots >= 0), the field relations of kBadSpec, a finite scale
/// and sink (kNonFinite), and sizes whose products fit in int64 and size_t
/// (kSizeOverflow). RingPool::create and every backend's configure() call
/// this one function; a backend's supports() answers only its own limits.
Status validate_pool_spec(const PoolSpec& spec);

/// Where attend() takes its rows from.
enum class KvSource : std::uint8_t {
  kPool,     ///< index values are pool slots (decode, verify, store_then_load)
  kScratch,  ///< index values are scratch rows (load_then_store's assembled input)
};

/// Same-step write-write collisions found by store() (two rows, one slot).
struct StoreReport {
  std::int64_t duplicate_slots = 0;  ///< slots written more than once in this call
};

/// The kernel table of one backend. All buffers are allocated in configure();
/// no call after it allocates. Host pointers in, host pointers out.
class KvBackend {
 public:
  virtual ~KvBackend() = default;

  /// "cpu", "cuda", ...
  virtual std::string_view name() const noexcept = 0;
  /// Whether this backend can run `spec`; on false, `why` says what is missing.
  virtual bool supports(const PoolSpec& spec, std::string* why) const = 0;
  /// Allocates the pool and scratch (window_keys + max_step_rows rows) for `spec`.
  virtual Status configure(const PoolSpec& spec) = 0;

  /// RoPE (keys, at `rope_positions`), quantize and store rows at `slots`.
  /// k, v: [slots.size(), kv_heads, head_dim]; v is ignored for shared rows.
  virtual Status store(std::span<const std::int64_t> slots, std::span<const std::int64_t> rope_positions,
                       const double* k, const double* v, std::span<const Tag> tags, StoreReport* report) = 0;
  /// Gathers pool rows at `index` (-1 entries skipped) into scratch rows
  /// [scratch_first, scratch_first + index.size()), with their tags and slots.
  virtual Status load(std::span<const std::int64_t> index, std::int64_t scratch_first) = 0;
  /// Puts new rows (RoPE'd, quantized like store) straight into scratch rows
  /// [scratch_first, ...); `origin_slots` records the pool slot each represents.
  virtual Status scratch_store(std::int64_t scratch_first, std::span<const std::int64_t> origin_slots,
                               std::span<const std::int64_t> rope_positions, const double* k, const double* v,
                               std::span<const Tag> tags) = 0;
  /// Attention of n queries over their index rows (-1 skipped).
  /// q: [n, q_heads, head_dim] (RoPE'd here at `rope_positions`);
  /// index: [n, width]; out: [n, q_heads, head_dim].
  /// With tracking on, read_tags/read_slots ([n, width]) receive the tag each
  /// read row held and the pool slot it represents (-1 for skipped columns).
  virtual Status attend(KvSource source, std::span<const std::int64_t> rope_positions, const double* q,
                        std::span<const std::int64_t> index, std::int64_t width, double* out, Tag* read_tags,
                        std::int64_t* read_slots) = 0;
  /// Tag of one pool slot (for audits and tests).
  virtual Tag slot_tag(std::int64_t slot) const = 0;
  /// Dequantized row of one pool slot: key [kv_heads*head_dim], value likewise
  /// (value == key for shared rows). For audits and tests.
  virtual Status read_row(std::int64_t slot, double* key, double* value) const = 0;
  /// Encoded bytes of one pool slot's key and value rows
  /// (format_row_bytes(format, kv_heads*head_dim) each; value == key for
  /// shared rows), in the layout of impl/element_format.hpp. Backends that
  /// cannot give them answer kUnsupported (the default).
  virtual Status read_row_bytes(std::int64_t slot, std::uint8_t* key, std::uint8_t* value) const;
  /// Names of the attention paths this backend dispatches between (the
  /// CUDA backend's kernels and split-K), for a run to say which it
  /// reached; empty (the default): one path, nothing to tell.
  virtual std::vector<std::string> attend_paths() const;
  /// Which of attend_paths() a pool of `spec` takes when its steps attend
  /// `step_queries` queries each (one entry per step that reads), by the
  /// backend's own dispatch. Callable before configure() and from several
  /// threads at once; empty when attend_paths() is.
  virtual std::vector<bool> attend_paths_run(const PoolSpec& spec,
                                             std::span<const std::int64_t> step_queries) const;
  /// Attention launches per attend_paths() entry since configure(): what
  /// this backend did reach (empty when attend_paths() is).
  virtual std::vector<std::int64_t> attend_paths_launched() const;
};

/// Factory: "cpu" always; "cuda" when built with CUDA. Throws nothing;
/// returns nullptr and sets `why` when the name is unknown or unavailable.
std::unique_ptr<KvBackend> make_backend(std::string_view name, std::string* why);

}  // namespace kvcheck::impl
