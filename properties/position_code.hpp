// Position coding: rows whose outputs tell which rows each query attended,
// for caches that report no slots (Capabilities reports_read_slots false:
// observed "outputs"). With the `position-code` value profile every query is
// q = 0, so every score is 0 whatever RoPE or the softmax scale do (a
// rotated zero is zero) and every attended row gets the same weight 1/Z
// (Z = rows attended, + e^sink with a sink logit). The values carry a code,
// so each output element is the mean of one code element over the rows the
// query read, and the decoder below recovers that multiset up to the limits
// listed here (README "Black-box engines: position coding").
//
// The code. The code elements are pairs (count, id) of the kv row (every
// element of [kv_heads * head_dim]; for shared rows with RoPE only the
// unrotated elements, dims >= rotary_dims of each head, since the stored
// value is the rotated key; with full RoPE no element survives and the
// profile codes nothing: such caches are excluded). M = pairs. A row written
// at position p gets, in pair e = p mod M, count 1 and id/D; every other
// value element is 0. id in 1..id_max is a hash of (layer, request,
// position, step), so a stale copy of the position (a rejected draft, an
// earlier occupant of the state, another request's row) has, with
// probability 1 - 1/id_max, another id. The output of query head h (of kv
// head g) at the count element of pair e is c_e / Z, at its id element
// s_e / (Z D): c_e rows of class e were read, their ids summing to s_e.
//
// Exactness per format: 1, 0 and id/D are stored exactly when id has at
// most the format's significant bits and D is a power of two:
//   f64  id_max 2^20 - 1, D 2^20     f32  id_max 2^12 - 1, D 2^12
//   bf16 id_max 255, D 2^8 (8 bits)  fp8  id_max 15, D 2^4 (e4m3 has 4
//        significant bits; the ue8m0 block scale is a power of two, so a
//        block whose largest element is 1 or 15/16 keeps 1 and id/16 exact)
// The decoder reads c_e and s_e back as c_e = round(out * Z) and s_e =
// round(out * Z * D): this needs the outputs accurate to about 1/(4 Z s_max)
// relative (f64 or f32 outputs over the exec protocol's doubles; an engine
// that rounds its outputs to bf16 decodes only tiny windows, but a correct
// output is still judged as today and passes).
//
// Limits (what the decoder cannot see):
//  * Z. Without a sink attention is invariant under reading every row twice:
//    Z is taken as the number of visible rows when the counts are integers
//    there, else the smallest Z that makes them integers. With a sink,
//    Z = n + e^sink with n = e^sink * sum c / (1 - sum c).
//  * Collisions of slots: same-step, outside-block and replaced-needed
//    collisions are slot facts; only their effect on some query's output is
//    seen (a row overwritten but never read again is invisible).
//  * A substitute whose id equals the lost row's (probability 1/id_max per
//    substitution) or several errors in one class that cancel.
//  * Rows the cache invents (garbage, rows of an earlier case) decode as one
//    unknown extra read (request -1) when they break the integer counts.
//  * Which of several lost visible rows of one class was lost (M smaller
//    than the window): the oldest consistent choice is reported.
// Classification mirrors the shadow map's: a visible row not read is
// overwritten when a stale copy of its position was read or another read is
// left to pair it with (its slot held that row), else missing; reads left
// over are extra.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "properties/observation.hpp"
#include "scenarios/scenario.hpp"
#include "support/prng.hpp"

namespace kvcheck::properties {

/// Where the code of a cache configuration lives (see the header comment).
struct PositionCodeLayout {
  std::vector<std::int64_t> elements;  ///< kv-row element of pair e's count (2e) and id (2e + 1)
  std::int64_t classes = 0;            ///< M: pairs (0: nothing can be coded)
  std::int64_t id_max = 1;             ///< ids are 1..id_max
  double id_scale = 1;                 ///< D: an id is stored as id / D
};

/// The layout for `cache` (format, head_dim, kv_heads, shared rows, RoPE).
PositionCodeLayout position_code_layout(const scenarios::CacheConfig& cache);

/// The id of the row `step_index` writes at (layer, request, position): 1..id_max.
std::int64_t position_code_id(const PositionCodeLayout& layout, std::int32_t layer, std::int64_t request,
                              std::int64_t position, std::int64_t step_index);

/// Appends one position's k, v (unless shared) and q: k uniform from `rng`
/// (or the code, for shared rows), v the code, q zeros.
void position_code_row(const scenarios::CacheConfig& cache, const PositionCodeLayout& layout,
                       std::int32_t layer, std::int64_t request, std::int64_t position,
                       std::int64_t step_index, Prng& rng, std::vector<double>& k, std::vector<double>& v,
                       std::vector<double>& q);

/// One layer's decoder: what kvcheck wrote (its own record, like the shadow
/// map's, but of rows sent rather than slots reported) and the decoding of
/// one query's outputs into overwritten / missing / extra rows.
class PositionDecoder {
 public:
  PositionDecoder(const scenarios::CacheConfig& cache, std::int32_t layer);

  /// Whether anything can be decoded (the layout has at least one pair).
  bool usable() const noexcept { return layout_.classes > 0; }

  /// Records the n rows a step wrote for `request` at first..first+n-1.
  void record_writes(std::int64_t request, std::int64_t first, std::int64_t n, std::int64_t step_index);

  /// `request` begins from the first `n` positions of `source` (a shared
  /// prefix): their latest rows are its rows there.
  void share_prefix(std::int64_t request, std::int64_t source, std::int64_t n);

  /// Decodes the output row of one query ([q_heads * head_dim]) of
  /// `request`, whose visible positions are q->visible_first..q->position,
  /// into q->overwritten, q->missing and q->extra (slot -1: unknown).
  void decode(std::int64_t request, const double* out, QueryObservation* q) const;

 private:
  struct Written {
    std::int64_t request = -1;
    std::int64_t position = -1;
    std::int64_t id = 0;
    std::uint64_t write_seq = 0;
  };
  scenarios::CacheConfig cache_;
  std::int32_t layer_ = 0;
  PositionCodeLayout layout_;
  std::uint64_t write_seq_ = 0;
  std::map<std::pair<std::int64_t, std::int64_t>, Written> latest_;  // (request, position)
  std::vector<std::vector<Written>> by_class_;                       // [classes] every row written
};

}  // namespace kvcheck::properties
