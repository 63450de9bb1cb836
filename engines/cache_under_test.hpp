// The step-level interface of a cache under test: the one thing the runner,
// `check`, `replay`, `sweep` and `audit` talk to. A cache may be one of ours
// (the ring pool over the CPU or CUDA kernel table, the layer-bound cache),
// an engine's cache in another process (`--impl exec:...`, the JSON Lines
// protocol of adapters/PROTOCOL.md), or anything a user implements in C++.
//
// A step goes in with its rows (keys and values before RoPE, queries before
// RoPE) and comes back with the outputs and, when the cache can tell, the
// physical slot each new row was written to and the slots each query read.
// Slots are opaque integers: kvcheck keeps its own shadow map (slot -> the
// row the cache last said it wrote there) and derives every observation from
// it, so a cache needs no tags and no particular addressing.
//
// A cache declares what it supports (Capabilities); the generator draws only
// that, and replay skips, with the reason, a scenario the cache cannot run.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "scenarios/scenario.hpp"
#include "support/error.hpp"

namespace kvcheck::engines {

/// A set of sizes (head_dim, rotary widths): the integers in [min, max]
/// (max 0: no upper limit) that are multiples of `multiple_of` and, when
/// `values` is not empty, among `values`. Default: every size.
struct SizeSet {
  std::int64_t min = 1;
  std::int64_t max = 0;  ///< 0: no upper limit
  std::int64_t multiple_of = 1;
  std::vector<std::int64_t> values;  ///< empty: any size the rules above allow

  bool contains(std::int64_t x) const noexcept;
  /// Whether every size is in the set (nothing declared).
  bool unrestricted() const noexcept;
  /// The member of the set closest to `x` along x/2, x/4, ... then 2x, 4x,
  /// ... (so a power of two stays one), else the largest member <= x, else
  /// the smallest member > x; nullopt when none is in [1, limit].
  std::optional<std::int64_t> fit(std::int64_t x, std::int64_t limit) const;
  /// The largest member <= x, if any.
  std::optional<std::int64_t> largest_at_most(std::int64_t x) const noexcept;
  /// The smallest member >= x, if any.
  std::optional<std::int64_t> smallest_at_least(std::int64_t x) const noexcept;
  /// "multiples of 8 up to 256", "one of 64, 128", "any".
  std::string describe() const;
};

/// The precision a cache accumulates scores and P·V in (README "Tolerances").
enum class Accumulation : std::uint8_t {
  kByFormat,  ///< binary64 for f64 rows, binary32 otherwise (the in-tree kernels)
  kF32,
  kF64,
};
/// "format", "f32", "f64".
const char* accumulation_name(Accumulation a) noexcept;

/// What the softmax probabilities are rounded to before they multiply V
/// (FlashAttention's kernels round P to the element type of V).
enum class ProbabilityRounding : std::uint8_t { kNone, kBf16, kFp16 };
/// "none", "bf16", "fp16".
const char* probability_rounding_name(ProbabilityRounding r) noexcept;

struct CacheSpec;

/// A cache's declared memory bound: at most `limit` rows (slots holding a
/// token's row) or blocks (blocks of Capabilities::block_size slots holding
/// at least one) per layer (all layers together for a cache with one pool
/// across its layers, Capabilities::shared_pool), for each request or for
/// all requests together. Padding is not a row. `limit` 0: what kvcheck gives the case
/// (resident_limit).
struct ResidentBound {
  enum class Unit : std::uint8_t { kNone, kRows, kBlocks };
  Unit unit = Unit::kNone;  ///< kNone: no bound declared
  bool per_request = false;  ///< false: all requests of a layer together
  std::int64_t limit = 0;
  bool declared() const noexcept { return unit != Unit::kNone; }
};

/// What a cache under test can run, and how it computes. Defaults: everything.
struct Capabilities {
  std::string name;  ///< "ring-pool/cpu", "layer-kv-cache", "exec:ring-cache", ...
  // One bool per row of KVCHECK_STEP_CAPABILITIES (scenarios/step_kinds.hpp):
  // prefill_load_then_store, prefill_store_then_load, decode, verify (verify(k)
  // and accept(a)), finish, reset, trim; preempt off unless declared
  // (scenarios::step_capability_default).
#define KVCHECK_CAPABILITY_STEP_BOOL(id, member, kind, order) \
  bool member = scenarios::step_capability_default(scenarios::StepCapability::id);
  KVCHECK_STEP_CAPABILITIES(KVCHECK_CAPABILITY_STEP_BOOL)
#undef KVCHECK_CAPABILITY_STEP_BOOL
  /// Every format of the table (support/formats.hpp) unless the cache says less.
  std::vector<scenarios::Format> formats =
      std::vector<scenarios::Format>(std::begin(kElementFormats), std::end(kElementFormats));
  std::vector<scenarios::RopeStyle> rope_styles = {scenarios::RopeStyle::kNone, scenarios::RopeStyle::kNeox,
                                                   scenarios::RopeStyle::kInterleaved};
  bool gqa = true;            ///< q_heads a multiple > 1 of kv_heads (includes MQA)
  bool shared_row = true;     ///< one stored row is both key and value
  bool sink = true;           ///< an attention-sink logit
  bool softmax_scale = true;  ///< a scale other than 1/sqrt(head_dim)
  bool partial_rope = true;   ///< rotary_dims < head_dim
  /// The cache attends to every row it holds (no sliding window): the
  /// generator then sets window = ring = a capacity no schedule exceeds.
  bool full_window_only = false;
  /// Each layer may have its own window and convention, global layers
  /// included (CacheSpec::layer_window_keys). Off unless declared: a cache
  /// that does not say so is never given a scenario that lists layer windows.
  bool per_layer_windows = false;
  // The shape space. The generator draws inside it; replay skips, with the
  // reason, a scenario outside it.
  SizeSet head_dims;            ///< head_dim values the cache runs
  SizeSet rotary_dims;          ///< rotary widths (rotary_dims > 0 with a RoPE style)
  std::int64_t max_states = 0;  ///< 0: no limit
  std::int64_t max_layers = 0;
  std::int64_t max_step_rows = 0;
  std::int64_t max_heads = 0;        ///< query heads
  std::int64_t max_kv_heads = 0;     ///< KV heads
  std::int64_t max_window_keys = 0;  ///< keys a query sees, itself included
  std::int64_t max_positions = 0;    ///< positions per request: every written position is < this
  // How it computes, for the output tolerance (README "Tolerances").
  Accumulation accumulation = Accumulation::kByFormat;
  ProbabilityRounding probabilities_rounded_to = ProbabilityRounding::kNone;
  /// The format each output is written in, after the accumulation
  /// (docs/semantics.md "Output formats"; hello "output_format"): a kernel
  /// that accumulates in binary32 and writes bf16 declares kBf16. Where it
  /// is narrower than the accumulation the tolerance gains the rounding into
  /// it, every output element must be a value of it, and `--bitwise`
  /// compares in it. kAccumulation: not declared (outputs as accumulated).
  OutputFormat output_format = OutputFormat::kAccumulation;
  /// Unit roundoff of the cache's RoPE (theta, angle, cos/sin, rotation); 0:
  /// that of its accumulation. A cache that rotates in double (2^-53) is held
  /// to the narrow RoPE allowance that gives, in stored keys and outputs.
  double rope_unit_roundoff = 0;
  /// False for a bookkeeping-only engine (a block manager without a kernel):
  /// it reports written and read slots and no outputs, and kvcheck computes
  /// each query's output itself over the rows its shadow map holds at the
  /// slots read (README "Bookkeeping-only engines").
  bool computes_outputs = true;
  bool reports_written_slots = true;
  bool reports_read_slots = true;
  /// Slots are state * capacity + position mod capacity: kvcheck then also
  /// counts writes outside the request's block and shows ring contents.
  bool ring_addressing = false;
  std::int64_t block_size = 0;  ///< paged addressing: slots are block * block_size + offset (0: not paged)
  /// With ring or paged addressing: the cache writes and reads rows in the
  /// pool it is opened with (ring: states * capacity; paged:
  /// paged_pool_blocks * block_size per layer), so an answer writing or
  /// reading any other slot fails its case.
  /// False where kvcheck does not size the pool (a recorded trace's engine):
  /// only a negative slot is impossible there.
  bool slots_in_pool = false;
  /// Step answers may carry `freed` (slots released): kvcheck then reports
  /// the resident set after each step and fails a free of a row still
  /// visible (hello "reports": {"frees": true}).
  bool reports_frees = false;
  /// Step answers may carry `cached` (docs/semantics.md "Cached rows"):
  /// slots released to the cache's free pool that still hold their rows
  /// for a later prefix begin until they are reused or freed. kvcheck then
  /// counts them in no resident bound, reports them apart from the rows
  /// held, and draws pool pressure for a cache that also shares prefixes
  /// (hello "reports": {"cached": true}).
  bool reports_cached = false;
  /// The memory bound the cache declares (hello "resident_bound"): kvcheck
  /// fails a step after which the cache holds more (ResidentBound).
  ResidentBound resident_bound;
  /// Lookahead slots (vLLM's num_lookahead_tokens, for a draft model's or
  /// EAGLE's speculative decoding): with each step the cache takes room for
  /// this many positions past the step's last row, which hold no row until a
  /// later step writes there (docs/semantics.md "Lookahead slots and deferred
  /// frees"). kvcheck's pool (paged_pool_blocks) and a default resident bound
  /// in blocks make room for them. Paged addressing only (hello
  /// "lookahead_slots").
  std::int64_t lookahead_slots = 0;
  /// A free deferral of N steps (SGLang's hybrid sliding-window allocator,
  /// which frees out-of-window slots every `eviction_interval` decodes): a
  /// row that left every window may stay held until N more of its request's
  /// own write steps have run. kvcheck's pool and default resident bounds
  /// make room for N steps of rows, and a block held past N steps fails the
  /// step (docs/semantics.md "Lookahead slots and deferred frees"). None:
  /// nothing declared and no deadline judged; a declared deferral needs
  /// reports_frees (hello "free_deferral_steps").
  std::optional<std::int64_t> free_deferral_steps;
  /// One pool of slots for all layers (vLLM's hybrid KV cache manager and
  /// SGLang's hybrid sliding-window allocator draw every layer group's block
  /// ids from one block pool): a slot id names the same memory whichever
  /// layer's answer gives it. kvcheck then sizes one pool, the sum of what
  /// it gives each layer (paged_pool_blocks), judges a write over a row
  /// another layer still sees as a collision (Collisions::other_layer), and
  /// counts a resident bound over all layers together (docs/semantics.md
  /// "One pool across layers"; hello "shared_pool"). Not with ring
  /// addressing (a ring's slots are its layer's by construction).
  bool shared_pool = false;
  /// Shared prefixes (Request::prefix): a request may begin from the first n
  /// positions of another, live or finished; the begin carries that
  /// request's rows there. Off unless the cache says so (hello
  /// "prefix_sharing"): the in-tree caches keep every request's rows apart.
  bool prefix_sharing = false;
  /// Prefix rows stored with the step (docs/semantics.md "Recompute in a
  /// step"): a begin from a prefix (a shared prefix, a resume) may leave
  /// positions it neither stores nor shares to the request's next step that
  /// writes rows on the layer (StepAnswer::recompute), which stores them
  /// with its own rows, before its queries read (StepAnswer::recomputed),
  /// as vLLM's scheduler computes the part of a prompt its prefix cache
  /// missed in the request's first step. kvcheck's pool (paged_pool_blocks)
  /// then makes room for a begin's rows and a step's at once (hello
  /// "recompute_in_step").
  bool recompute_in_step = false;
  /// Refusal probes the cache supports (see properties/probes.hpp).
  std::vector<std::string> probes;
  /// The cache's own fast kernel, when it has one it can run here (the CPU
  /// ring pool's AVX-512 block kernel on a CPU that has AVX-512): whether a
  /// run of `spec` attends through it. The checker counts coverage class
  /// fast_cpu_kernel by it and gates that class only when it is set: it
  /// knows no cache by name, a cache declares what it can reach. Empty: no
  /// such kernel (the class is not reachable and counts no case).
  std::function<bool(const CacheSpec& spec)> fast_kernel_runs;
  /// The cache's own kernel paths, by the names it gives them (the CUDA
  /// ring pool's dispatch classes: cuda_general_kernel,
  /// cuda_slot_major_kernel, cuda_warp_pipelined_kernel, cuda_split_k). The
  /// checker counts one coverage class per entry, after the profile's own,
  /// and gates them in the production profile. Empty: none declared.
  std::vector<std::string> kernel_paths;
  /// Which of kernel_paths a run of `spec` takes when its steps attend
  /// `step_queries` queries each (one entry per step that writes rows), by
  /// the cache's own dispatch: one bool per kernel_paths entry. Called from
  /// several threads at once. Empty exactly when kernel_paths is.
  std::function<std::vector<bool>(const CacheSpec& spec, std::span<const std::int64_t> step_queries)>
      kernel_paths_run;

  /// Whether `cache` (with steps of at most `max_step_rows` rows) fits; on
  /// false `why` names the first thing that does not.
  bool supports(const scenarios::CacheConfig& cache, std::int64_t max_step_rows, std::string* why) const;
  /// Whether the cache runs this step kind (and prefill order).
  bool supports_step(const scenarios::Step& step) const noexcept;
  /// The bool of one capability row (KVCHECK_STEP_CAPABILITIES).
  bool runs(scenarios::StepCapability capability) const noexcept;
  /// Whether a whole scenario fits (configuration and every step).
  bool supports(const scenarios::Scenario& scenario, std::string* why) const;
  /// Unit roundoff of the accumulation for rows of `format` (2^-53 or 2^-24).
  double accumulation_epsilon(scenarios::Format format) const noexcept;
  /// Unit roundoff of the probabilities' rounding before P·V (0: not rounded;
  /// bf16 2^-8, fp16 2^-11).
  double probability_epsilon() const noexcept;
};

/// What the cache is asked to be for one run.
struct CacheSpec {
  scenarios::CacheConfig cache;  ///< ring_rows is the capacity per state
  std::int64_t window_keys = 1;  ///< keys a query sees, itself included
  /// Per layer, when the scenario lists layer windows (else empty, and every
  /// layer has window_keys): keys a query of that layer sees,
  /// scenarios::kGlobalWindowKeys for a global layer.
  std::vector<std::int64_t> layer_window_keys;
  std::int64_t max_step_rows = 1;
  double softmax_scale = 1.0;  ///< resolved (default 1/sqrt(head_dim))
  /// Paged: blocks in the pool per layer, or in the one pool of a cache
  /// with Capabilities::shared_pool (0: not paged, or derived by
  /// paged_pool_blocks).
  std::int64_t pool_blocks = 0;
  /// The most rows one begin of the run carries (a shared prefix's
  /// positions, a resume's committed length; 0: none): with
  /// Capabilities::recompute_in_step a step may store that many besides its
  /// own, and the pool kvcheck gives makes room for them.
  std::int64_t max_begin_rows = 0;
};

/// The pool kvcheck gives a paged cache of `block_size` rows per block
/// (adapters/PROTOCOL.md "Capacity"): per state, enough blocks for
/// R = max(capacity, keys - 1 + max_step_rows) rows that need not start at a
/// block boundary, ceil(R / block_size) + 1; states times that in all. A
/// cache that stores a step's rows before its queries read holds keys - 1 +
/// max_step_rows rows of a request at once.
/// `slack_rows` more rows per state are added to R before the blocks are
/// counted (pool_slack_rows: a cache's declared lookahead and free deferral).
/// `in_step_rows` (a cache that recomputes prefix rows in a step:
/// spec.max_begin_rows) makes R at least in_step_rows + max_step_rows, a
/// begin's rows and a step's held at once.
std::int64_t paged_pool_blocks(const CacheSpec& spec, std::int64_t block_size, std::int64_t slack_rows = 0,
                               std::int64_t in_step_rows = 0) noexcept;
/// The rows per state a cache's declared slack adds to what it may hold at
/// once (docs/semantics.md "Lookahead slots and deferred frees"):
/// lookahead_slots, plus free_deferral_steps * max_step_rows (the positions
/// N steps of at most max_step_rows rows move a window by). 0 when none.
std::int64_t pool_slack_rows(const Capabilities& caps, const CacheSpec& spec) noexcept;
/// The pool kvcheck gives the cache `caps` for a run of `spec`:
/// paged_pool_blocks(spec, caps.block_size, pool_slack_rows(caps, spec))
/// (with spec.max_begin_rows in a step for a cache that recomputes in one),
/// or, for a cache with one pool across its layers (caps.shared_pool), the
/// sum over layers of layer_pool_blocks (docs/semantics.md "One pool across
/// layers"). The spec's own pool_blocks, when set, is the pool as given.
std::int64_t paged_pool_blocks(const CacheSpec& spec, const Capabilities& caps) noexcept;
/// Layer `layer`'s share of a pool shared by the layers: what kvcheck
/// gives one layer of its own window, per state ceil(R / block_size) + 1
/// blocks for R = max(capacity, keys - 1 + max_step_rows) plus the cache's
/// slack rows, where a global layer (or a spec without layer windows, a
/// layer of the case's window) has keys = window_keys at most capacity.
std::int64_t layer_pool_blocks(const CacheSpec& spec, const Capabilities& caps, std::int32_t layer) noexcept;

/// The bound in force for a run of `spec`: the declared limit, or (limit 0)
/// what kvcheck gives the case: rows per request `capacity` plus the rows a
/// declared free deferral may keep (free_deferral_steps * max_step_rows;
/// lookahead slots hold no row), in all `states` times that; blocks in all
/// the pool's `pool_blocks` (paged_pool_blocks with the cache's slack when
/// the spec leaves it 0), per request that over `states`. A cache with one
/// pool across its layers (shared_pool) is bounded over all layers
/// together: the default in rows is `layers` times the above, in blocks the
/// whole shared pool (docs/semantics.md "One pool across layers"). 0 when no
/// bound is declared.
std::int64_t resident_limit(const Capabilities& caps, const CacheSpec& spec) noexcept;

/// One step sent to a cache (prefill, decode, verify, accept, finish, reset)
/// or a begin.
struct StepCall {
  enum class Op : std::uint8_t { kBegin, kStep };
  Op op = Op::kStep;
  scenarios::Step step;  ///< kind, request, rows/order/drafts/accepted
  std::int32_t layer = 0;
  std::int64_t state = 0;
  std::int64_t position = 0;     ///< first position written (the logical length)
  std::int64_t rows = 0;         ///< rows written / queries run (0 for bookkeeping steps)
  std::int64_t step_index = -1;  ///< index into the scenario's steps (for error messages)
  const double* k = nullptr;     ///< [rows, kv_heads * head_dim], before RoPE
  const double* v = nullptr;     ///< [rows, kv_heads * head_dim]; nullptr for shared rows
  const double* q = nullptr;     ///< [rows, q_heads * head_dim], before RoPE
  /// A begin from a shared prefix (Request::prefix): the request it starts
  /// from and n; k and v then hold that request's n rows at positions 0 ..
  /// n-1 (rows = 0: a begin runs no query), for a cache that no longer holds
  /// them to store again. n = 0: no prefix.
  std::int64_t prefix_request = -1;
  std::int64_t prefix_positions = 0;
};

/// How a step's reads relate to its own writes.
enum class ReadView : std::uint8_t {
  kAfterWrites,  ///< all rows stored, then every query read (decode, verify, store_then_load)
  kCausal,       ///< each query saw the step's rows up to itself, else the pool before the step
};

/// What a step answered. Vectors are reused between calls.
struct StepAnswer {
  std::vector<double> out;  ///< [rows, q_heads * head_dim]
  bool has_written = false;
  std::vector<std::int64_t> written;  ///< [rows] slot of each new row
  bool has_reads = false;
  std::vector<std::int64_t> read_offsets;  ///< [rows + 1] query i read read_slots[off[i], off[i+1])
  std::vector<std::int64_t> read_slots;    ///< -1 entries are ignored
  ReadView view = ReadView::kAfterWrites;
  /// Slots the step wrote with no token (padding of a padded batch),
  /// written with the step's rows, after them.
  std::vector<std::int64_t> padded;
  /// Rows the cache moved (rolling or compacting): slot `first`'s row
  /// copied to slot `second`, in order, before the step's rows are written.
  std::vector<std::pair<std::int64_t, std::int64_t>> moved;
  /// Slots the cache released during the step (applied after its reads; a
  /// slot the step wrote keeps the step's row).
  std::vector<std::int64_t> freed;
  /// Slots the cache released to its free pool during the step with their
  /// rows still readable by a later prefix begin (applied after its reads,
  /// as `freed`): no request holds them, and any write may reuse them.
  std::vector<std::int64_t> cached;
  /// A begin's answer, from a cache that recomputes in a step
  /// (Capabilities::recompute_in_step): prefix positions it neither stored
  /// nor shares, which the request's next step that writes rows on the
  /// layer stores (their `written` entries are -1).
  std::vector<std::int64_t> recompute;
  /// That step's answer: (position, slot) of each prefix row it stored,
  /// before its own rows and its queries (docs/semantics.md "Recompute in a
  /// step").
  std::vector<std::pair<std::int64_t, std::int64_t>> recomputed;
  /// Same-step write-write collisions the cache itself detected (beyond what
  /// `written` shows; e.g. a GPU race counter). 0 when unknown.
  std::int64_t duplicate_slots = 0;
  /// The new rows as the cache stored them, when it can tell (README
  /// "Stored rows"): decoded values, exactly as stored (keys after RoPE).
  /// stored_known[i] == 0 when row i's slot no longer holds it (a same-step
  /// collision); such rows are not judged.
  bool has_stored = false;
  std::vector<double> stored_k;            ///< [rows, kv_heads * head_dim]
  std::vector<double> stored_v;            ///< [rows, kv_heads * head_dim]; empty for shared rows
  std::vector<std::uint8_t> stored_known;  ///< [rows]
  /// The encoded bytes of the same rows in the element format's layout
  /// (README "Stored rows"), when the cache can give them: judged bit for bit.
  bool has_stored_bytes = false;
  std::vector<std::uint8_t> stored_k_bytes;  ///< [rows, bytes per row]
  std::vector<std::uint8_t> stored_v_bytes;  ///< [rows, bytes per row]; empty for shared rows
  void clear() {
    out.clear();
    has_written = has_reads = false;
    written.clear();
    read_offsets.clear();
    read_slots.clear();
    view = ReadView::kAfterWrites;
    duplicate_slots = 0;
    padded.clear();
    moved.clear();
    freed.clear();
    cached.clear();
    recompute.clear();
    recomputed.clear();
    has_stored = has_stored_bytes = false;
    stored_k.clear();
    stored_v.clear();
    stored_known.clear();
    stored_k_bytes.clear();
    stored_v_bytes.clear();
  }
};

/// A typed refusal of the cache (its own vocabulary: "state-busy", "full", ...).
struct Refusal {
  std::string code;
  std::string detail;
};

/// The result of a call: nullopt when it went through.
using StepStatus = std::optional<Refusal>;

/// The cache under test crashed during a run: an exec adapter's process
/// ended (it exited, or closed its stdout), or a C++ cache threw from a call
/// or from open (the runner turns what it threw into this). A finding of the
/// run, never bad input: the run fails at its step with this message and is
/// shrunk like any other failure. It is an Error (kAdapter for an adapter)
/// so that where no run is going on (an adapter that dies at hello) it stays
/// the one-line error it always was.
class CacheCrash : public Error {
 public:
  /// `spent`: the provider's process is gone; the provider starts a new one
  /// at its next open (an exec adapter), or the caller makes a new provider.
  CacheCrash(ErrorId id, std::string where, const std::string& rule, bool spent)
      : Error(id, std::move(where), rule), spent_(spent) {}
  /// Whether the provider's process ended with the crash.
  bool spent() const noexcept { return spent_; }

 private:
  bool spent_;
};

/// One cache instance for one run (all layers of it).
class CacheUnderTest {
 public:
  virtual ~CacheUnderTest() = default;
  /// begin, or a step (prefill/decode/verify fill `answer`; others leave it empty).
  /// A refusal must leave the cache exactly as it was.
  virtual StepStatus call(const StepCall& call, StepAnswer* answer) = 0;
  /// A refusal probe (properties/probes.hpp): a call the cache must refuse.
  /// Returns the refusal, or nullopt when the cache wrongly accepted it.
  virtual StepStatus probe(const std::string& name, const StepCall& context);
  /// A fingerprint of everything the cache stores for `layer` (bytes,
  /// lengths, bindings), when the cache can give one; refused calls and
  /// probes must leave it unchanged.
  virtual std::optional<std::uint64_t> fingerprint(std::int32_t layer) const;
};

/// Makes caches of one kind; one provider per worker thread (an exec
/// provider owns one child process and reuses it for every run).
class CacheProvider {
 public:
  virtual ~CacheProvider() = default;
  virtual const Capabilities& capabilities() = 0;
  /// Opens a cache for `spec`, or returns the refusal (the run is skipped).
  /// Throws kvcheck::Error for a broken provider (an adapter that crashed).
  virtual std::unique_ptr<CacheUnderTest> open(const CacheSpec& spec, Refusal* refused) = 0;
  /// A name for reports ("cpu", "cuda", "layer", "exec:python3 adapters/ring_cache.py").
  virtual std::string name() const = 0;
};

/// FNV-1a over bytes, for fingerprints.
std::uint64_t fnv1a(const void* data, std::size_t bytes,
                    std::uint64_t hash = 1469598103934665603ull) noexcept;
/// A fingerprint hash of bytes, eight at a time in four independent lanes
/// (about ten times FNV-1a's speed: fingerprints of a whole pool are taken
/// around every refusal probe, so their cost grows with the pool).
std::uint64_t hash_words(const void* data, std::size_t bytes, std::uint64_t hash) noexcept;

}  // namespace kvcheck::engines
