// The reference side of one run (internal to properties/runner.cpp): what the
// model keeps for each written row and how it computes a query's reference
// outputs, certified in double-double where the balls decide every figure
// (model/certified.hpp) and in MPFR at the requested precision otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "model/attention.hpp"
#include "model/certified.hpp"
#include "model/encoding.hpp"
#include "model/real.hpp"
#include "model/visible.hpp"
#include "properties/observation.hpp"
#include "properties/shadow.hpp"
#include "properties/stored_rows.hpp"
#include "properties/tolerance.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// The model's truth for one written row: exact rotated key and value, the
/// reference encoding of both (model/encoding.hpp: what a correct cache
/// stores) and its decoded values, and how far each stored key element may
/// be from it (model/error_bounds.hpp).
template <class R>
struct TruthRow {
  model::Projected<R> exact;
  model::Projected<R> dequantized;
  model::EncodedRow key_encoding, value_encoding;
  std::vector<double> key_dev;  ///< [kv_width] RoPE deviation allowed per key element (0: exact)
  std::vector<double> key_err;  ///< [kv_width] key_dev plus a possible rounding flip: for the tolerance
  // The certified reference (model/certified.hpp) keeps balls and fills the
  // MPFR rows above only when a query needs them (real_ready).
  bool real_ready = true;
  bool exact_is_encoded =
      false;  ///< the encoding is the exact row (f64, no rotation): one reference serves both
  std::vector<double> k_in, v_in;                  ///< [kv_width] the unrotated input key and the value
  std::vector<model::certified::Ball> k_ball;      ///< [kv_width] rotated key (MPFR's value inside)
  std::vector<model::certified::Ball> v_ball;      ///< [kv_width] value (exact)
  std::vector<model::certified::Ball> deq_k_ball;  ///< [kv_width] reference-encoded key (exact)
  std::vector<model::certified::Ball> deq_v_ball;  ///< [kv_width] reference-encoded value (exact)
};

using RowKey = std::pair<std::int64_t, std::int64_t>;  // (request, position)

/// Accumulation precision of the production kernels per format.
inline double accumulation_epsilon(ElementFormat f) {
  return f == ElementFormat::kF64 ? 0x1.0p-53 : 0x1.0p-24;
}

template <class R>
model::Row<R> to_real(const double* x, std::int64_t n) {
  model::Row<R> r;
  r.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) r.emplace_back(x[i]);
  return r;
}

template <class R>
void rotate_heads(model::Row<R>& flat, std::int32_t heads, std::int32_t head_dim, std::int64_t position,
                  const model::Rope& rope) {
  for (std::int32_t h = 0; h < heads; ++h) {
    model::Row<R> slice = model::head_slice(flat, h, head_dim);
    model::rope_rotate(slice, position, rope);
    std::copy(slice.begin(), slice.end(), flat.begin() + static_cast<std::ptrdiff_t>(h) * head_dim);
  }
}

/// The certified reference's per-run state (model/certified.hpp): MPFR's
/// theta_i, scale and unit roundoff, and the RoPE factors of the positions
/// of the current step.
template <class Real>
struct Certifier {
  bool on = false;
  double um = 0;
  model::Rope rope;
  std::vector<Real> theta;
  model::certified::Ball scale;
  std::optional<double> sink;
  struct Factors {
    std::vector<model::certified::Ball> cos_f, sin_f;
  };
  std::map<std::int64_t, Factors> factors;  ///< by position; cleared at every step
  std::vector<double> theta_d;              ///< theta as doubles (angle bounds)
  model::certified::RopeSteps steps;        ///< from theta, made on the first advance (169-bit sin/cos)
  model::certified::RopeTrack track;        ///< the last position's factors, carried on

  void set_rope(const model::Rope& r) {
    rope = r;
    theta = model::certified::rope_thetas<Real>(r);
    for (const Real& t : theta) theta_d.push_back(model::to_double(t));
  }

  /// The factors at `position`: carried on from the previous position
  /// (model::certified::RopeTrack) while the angles stay below 2^40 and the
  /// chain is short, else MPFR's own cos and sin.
  const Factors& at(std::int64_t position) {
    auto it = factors.find(position);
    if (it != factors.end()) return it->second;
    it = factors.emplace(position, Factors{}).first;
    double angle = 0;
    for (const double t : theta_d) angle = std::max(angle, std::fabs(t) * static_cast<double>(position));
    if (angle > 0x1.0p40) {
      model::certified::rope_factors(theta, position, &it->second.cos_f, &it->second.sin_f);
      return it->second;
    }
    if (track.position == position - 1 && track.c.size() == theta.size() && track.steps < 4096) {
      if (steps.c.size() != theta.size())
        steps = model::certified::rope_steps(std::vector<model::Real50>(theta.begin(), theta.end()));
      model::certified::rope_advance(steps, &track);
    } else {
      model::certified::rope_anchor(theta, position, um, &track);
    }
    model::certified::rope_track_balls(track, theta_d, um, &it->second.cos_f, &it->second.sin_f);
    return it->second;
  }
};

inline std::vector<model::certified::Ball> exact_balls(const std::vector<double>& x) {
  std::vector<model::certified::Ball> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = model::certified::exact(x[i]);
  return out;
}

/// Every ball's double, when all are pinned (model::certified::pin_double).
inline bool pin_all(const std::vector<model::certified::Ball>& balls, std::vector<double>* out) {
  out->resize(balls.size());
  for (std::size_t i = 0; i < balls.size(); ++i) {
    if (!model::certified::pin_double(balls[i], &(*out)[i])) return false;
  }
  return true;
}

/// The reference encoding of a row known only as balls, when every row in
/// the box encodes the same: the encoding is monotone in each magnitude (and
/// the fp8 scale in the block maximum), so equal encodings of the box's
/// smallest and largest magnitudes decide it. Signs must be fixed.
inline bool pin_encoding(model::Encoding enc, const std::vector<model::certified::Ball>& balls,
                         const std::vector<double>& pinned, model::EncodedRow* out) {
  if (enc == model::Encoding::kF64) {  // the encoding is the nearest double: pinned
    *out = model::encode_row(enc, pinned);
    return true;
  }
  std::vector<double> small(balls.size()), big(balls.size());
  for (std::size_t i = 0; i < balls.size(); ++i) {
    const auto& b = balls[i];
    if (b.r == 0 && b.c.lo == 0) {
      small[i] = big[i] = b.c.hi;
      continue;
    }
    double lo = 0, hi = 0;
    model::certified::outward(b, &lo, &hi);
    if (lo > 0) {
      small[i] = lo;
      big[i] = hi;
    } else if (hi < 0) {
      small[i] = hi;
      big[i] = lo;
    } else {
      return false;
    }
  }
  model::EncodedRow a = model::encode_row(enc, small);
  const model::EncodedRow b = model::encode_row(enc, big);
  if (a.bytes != b.bytes || a.values != b.values || a.scale_exponents != b.scale_exponents) return false;
  *out = std::move(a);
  return true;
}

/// The reference computation of one run: the scenario's shapes, the reference
/// encoding, and the certifier, with the rows' and queries' reference values.
template <class Real>
struct RowReference {
  const scenarios::CacheConfig& cache;
  std::int64_t kv_width = 0, q_width = 0;
  std::int32_t group = 1;
  model::Heads heads;
  model::Rope rope;
  Real scale;
  std::optional<Real> sink;
  model::Encoding encoding = model::Encoding::kF64;
  double accum_eps = 0;
  Certifier<Real> cert;
  std::int64_t mpfr_queries = 0;  ///< queries whose reference came from MPFR

  /// A row in MPFR: the exact rotated key, its reference encoding and allowances.
  void make_real_row(TruthRow<Real>& row, std::int64_t p, const double* k, const double* v) {
    row.exact.k = to_real<Real>(k, kv_width);
    rotate_heads(row.exact.k, cache.kv_heads, cache.head_dim, p, rope);
    if (!cache.shared_row) row.exact.v = to_real<Real>(v, kv_width);
    row.key_encoding = model::encode_row(encoding, row.exact.k);
    row.dequantized.k = to_real<Real>(row.key_encoding.values.data(), kv_width);
    if (!cache.shared_row) {
      row.value_encoding = model::encode_row(encoding, row.exact.v);
      row.dequantized.v = to_real<Real>(row.value_encoding.values.data(), kv_width);
    }
    key_deviations(row.exact.k, row.key_encoding, cache.kv_heads, cache.head_dim, p, rope, encoding,
                   accum_eps, &row.key_dev, &row.key_err);
    if (!cert.on) return;
    row.k_ball.resize(row.exact.k.size());
    for (std::size_t e = 0; e < row.exact.k.size(); ++e)
      row.k_ball[e] = model::certified::from_real(row.exact.k[e]);
    row.deq_k_ball = exact_balls(row.key_encoding.values);
    if (!cache.shared_row) {
      row.v_in.assign(v, v + kv_width);
      row.v_ball = exact_balls(row.v_in);
      row.deq_v_ball = exact_balls(row.value_encoding.values);
    }
  }

  /// The same row from balls, when they pin the key's doubles and encoding.
  bool certify_row(TruthRow<Real>& row, std::int64_t p, const double* k, const double* v,
                   std::vector<double>* k_pinned) {
    const auto& f = cert.at(p);
    row.k_ball =
        model::certified::rotate_row(k, cache.kv_heads, cache.head_dim, rope, f.cos_f, f.sin_f, cert.um);
    if (!pin_all(row.k_ball, k_pinned) || !pin_encoding(encoding, row.k_ball, *k_pinned, &row.key_encoding)) {
      return false;
    }
    row.k_in.assign(k, k + kv_width);
    row.deq_k_ball = exact_balls(row.key_encoding.values);
    if (!cache.shared_row) {
      row.v_in.assign(v, v + kv_width);
      row.value_encoding = model::encode_row(encoding, row.v_in);  // exact inputs: as in MPFR
      row.v_ball = exact_balls(row.v_in);
      row.deq_v_ball = exact_balls(row.value_encoding.values);
    }
    key_deviations(*k_pinned, row.key_encoding, cache.kv_heads, cache.head_dim, p, rope, encoding, accum_eps,
                   &row.key_dev, &row.key_err);
    row.real_ready = false;
    row.exact_is_encoded = (cache.shared_row || row.v_in == row.value_encoding.values) &&
                           std::equal(row.k_ball.begin(), row.k_ball.end(), row.key_encoding.values.begin(),
                                      [](const model::certified::Ball& b, double x) {
                                        return b.r == 0 && b.c.lo == 0 && b.c.hi == x;
                                      });
    return true;
  }

  /// The MPFR rows of a certified row, for a query that falls back.
  void ensure_real(TruthRow<Real>& row, std::int64_t p) {
    if (row.real_ready) return;
    row.exact.k = to_real<Real>(row.k_in.data(), kv_width);
    rotate_heads(row.exact.k, cache.kv_heads, cache.head_dim, p, rope);
    row.dequantized.k = to_real<Real>(row.key_encoding.values.data(), kv_width);
    if (!cache.shared_row) {
      row.exact.v = to_real<Real>(row.v_in.data(), kv_width);
      row.dequantized.v = to_real<Real>(row.value_encoding.values.data(), kv_width);
    }
    row.real_ready = true;
  }

  /// The stored key judged: from the pinned doubles when that decides it (a
  /// rotated element is judged against allowances narrowed by more than the
  /// pinned value's and the double subtraction's error, so a pass there is a
  /// pass in MPFR), else in MPFR.
  std::string key_problem(TruthRow<Real>& row, std::int64_t p, const std::vector<double>* k_pinned,
                          const double* stored, const std::uint8_t* bytes) {
    if (k_pinned != nullptr) {
      const bool rotated =
          std::any_of(row.key_dev.begin(), row.key_dev.end(), [](double d) { return d > 0; });
      if (!rotated)
        return check_stored_row(encoding, *k_pinned, row.key_dev, row.key_encoding, stored, bytes);
      std::vector<double> narrow = row.key_dev;
      bool usable = true;
      for (std::size_t e = 0; e < narrow.size(); ++e) {
        if (narrow[e] == 0) continue;
        const double m = (std::fabs((*k_pinned)[e]) + narrow[e]) * 0x1.0p-51 + 0x1.0p-1060;
        usable = usable && narrow[e] > m;
        narrow[e] -= m;
      }
      if (usable && check_stored_row(encoding, *k_pinned, narrow, row.key_encoding, stored, bytes).empty())
        return std::string();
    }
    ensure_real(row, p);
    return check_stored_row(encoding, row.exact.k, row.key_dev, row.key_encoding, stored, bytes);
  }

  /// The model's row for position `p` (input key and value rows), and the
  /// row the cache says it stored (row `i` of `answer`), when it says, judged
  /// against the reference encoding (README "Stored rows") into `obs`.
  TruthRow<Real> written_row(std::int64_t p, const double* k_row, const double* v_row,
                             const engines::StepAnswer& answer, std::int64_t i, StepObservation* obs) {
    TruthRow<Real> row;
    std::vector<double> k_pinned;
    const bool certified_row = cert.on && certify_row(row, p, k_row, v_row, &k_pinned);
    if (!certified_row) {
      row = TruthRow<Real>{};
      make_real_row(row, p, k_row, v_row);
    }
    // The row as the cache stored it, when it says: judged against the
    // reference encoding (README "Stored rows").
    if (answer.has_stored && answer.stored_known[static_cast<std::size_t>(i)] != 0) {
      ++obs->stored_rows_checked;
      const std::int64_t row_bytes = format_row_bytes(encoding, kv_width);
      const std::vector<double> no_dev(static_cast<std::size_t>(kv_width), 0.0);
      std::string problem =
          key_problem(row, p, certified_row ? &k_pinned : nullptr, answer.stored_k.data() + i * kv_width,
                      answer.has_stored_bytes ? answer.stored_k_bytes.data() + i * row_bytes : nullptr);
      std::string which = "key";
      if (problem.empty() && !cache.shared_row) {
        which = "value";
        // The value is exact input: judged the same from doubles as in MPFR.
        const double* stored_v = answer.stored_v.data() + i * kv_width;
        const std::uint8_t* stored_vb =
            answer.has_stored_bytes ? answer.stored_v_bytes.data() + i * row_bytes : nullptr;
        problem =
            row.real_ready
                ? check_stored_row(encoding, row.exact.v, no_dev, row.value_encoding, stored_v, stored_vb)
                : check_stored_row(encoding, row.v_in, no_dev, row.value_encoding, stored_v, stored_vb);
      }
      if (!problem.empty()) {
        if (obs->encoding_mismatches == 0) {
          obs->encoding_detail = "position " + std::to_string(p) + " stored " + which + " " + problem;
        }
        ++obs->encoding_mismatches;
      }
    }
    return row;
  }

  /// A query's reference outputs over the reference-encoded rows (`ref`) and
  /// over the exact rows (`ref_exact`), and its rotated query, as the doubles
  /// MPFR's values round to. `visible_rows` are positions visible.first ..
  /// visible.last; `q_row` is the query's unrotated input.
  void query_reference(const double* q_row, std::int64_t p, const model::PositionRange& visible,
                       const std::vector<TruthRow<Real>*>& visible_rows, std::vector<double>* ref_out,
                       std::vector<double>* ref_exact_out, std::vector<double>* query_out) {
    std::vector<double>& ref = *ref_out;
    std::vector<double>& ref_exact = *ref_exact_out;
    std::vector<double>& query = *query_out;
    // From balls when they pin every figure, else from MPFR.
    bool pinned = false;
    if (cert.on) {
      const auto& f = cert.at(p);
      const auto q_ball =
          model::certified::rotate_row(q_row, cache.q_heads, cache.head_dim, rope, f.cos_f, f.sin_f, cert.um);
      std::vector<model::certified::Ball> out_deq(static_cast<std::size_t>(q_width)),
          out_exact(out_deq.size());
      model::certified::HeadRows deq_rows, exact_rows;
      // Identical inputs give MPFR identical outputs: one attention serves both.
      const bool same = std::all_of(visible_rows.begin(), visible_rows.end(),
                                    [](const TruthRow<Real>* row) { return row->exact_is_encoded; });
      for (std::int32_t h = 0; h < cache.q_heads; ++h) {
        const auto off = static_cast<std::size_t>(h / group) * static_cast<std::size_t>(cache.head_dim);
        deq_rows.keys.clear();
        deq_rows.values.clear();
        exact_rows.keys.clear();
        exact_rows.values.clear();
        for (const TruthRow<Real>* row : visible_rows) {
          deq_rows.keys.push_back(row->deq_k_ball.data() + off);
          deq_rows.values.push_back((cache.shared_row ? row->deq_k_ball : row->deq_v_ball).data() + off);
          exact_rows.keys.push_back(row->k_ball.data() + off);
          exact_rows.values.push_back((cache.shared_row ? row->k_ball : row->v_ball).data() + off);
        }
        const auto at = static_cast<std::size_t>(h) * static_cast<std::size_t>(cache.head_dim);
        model::certified::attend(q_ball.data() + at, deq_rows, cache.head_dim, cert.scale, cert.sink, cert.um,
                                 out_deq.data() + at);
        if (!same) {
          model::certified::attend(q_ball.data() + at, exact_rows, cache.head_dim, cert.scale, cert.sink,
                                   cert.um, out_exact.data() + at);
        }
      }
      pinned = pin_all(q_ball, &query) && pin_all(out_deq, &ref) &&
               pin_all(same ? out_deq : out_exact, &ref_exact);
    }
    if (!pinned) {
      if (!std::is_same_v<Real, double>) ++mpfr_queries;
      std::vector<const model::Projected<Real>*> exact, deq;
      for (std::int64_t j = visible.first; j <= visible.last; ++j) {
        TruthRow<Real>* row = visible_rows[static_cast<std::size_t>(j - visible.first)];
        ensure_real(*row, j);
        exact.push_back(&row->exact);
        deq.push_back(&row->dequantized);
      }
      model::Row<Real> query_real = to_real<Real>(q_row, q_width);
      rotate_heads(query_real, cache.q_heads, cache.head_dim, p, rope);
      auto doubles = [](const model::Row<Real>& x) {
        std::vector<double> d(x.size());
        for (std::size_t e = 0; e < x.size(); ++e) d[e] = model::to_double(x[e]);
        return d;
      };
      ref = doubles(model::attend_heads(query_real, deq, heads, scale, sink));
      ref_exact = doubles(model::attend_heads(query_real, exact, heads, scale, sink));
      query = doubles(query_real);
    }
  }
};

}  // namespace kvcheck::properties
