#include "properties/runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "engines/factory.hpp"
#include "engines/ring_pool_cache.hpp"
#include "model/attention.hpp"
#include "model/certified.hpp"
#include "model/encoding.hpp"
#include "model/error_bounds.hpp"
#include "model/real.hpp"
#include "model/visible.hpp"
#include "properties/rows.hpp"
#include "properties/shadow.hpp"
#include "properties/stored_rows.hpp"
#include "properties/tolerance.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/assert.hpp"
#include "support/error.hpp"

namespace kvcheck::properties {

namespace {

using scenarios::Scenario;
using scenarios::StepKind;

model::WindowConvention to_model(scenarios::Convention c) {
  switch (c) {
    case scenarios::Convention::kKeys: return model::WindowConvention::kKeys;
    case scenarios::Convention::kLeft: return model::WindowConvention::kLeft;
    case scenarios::Convention::kOffByOne: return model::WindowConvention::kOffByOne;
  }
  return model::WindowConvention::kKeys;
}

model::RopeStyle to_model(scenarios::RopeStyle s) {
  switch (s) {
    case scenarios::RopeStyle::kNone: return model::RopeStyle::kNone;
    case scenarios::RopeStyle::kNeox: return model::RopeStyle::kNeox;
    case scenarios::RopeStyle::kInterleaved: return model::RopeStyle::kInterleaved;
  }
  return model::RopeStyle::kNone;
}

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
  bool exact_is_encoded = false;   ///< the encoding is the exact row (f64, no rotation): one reference serves both
  std::vector<double> k_in, v_in;  ///< [kv_width] the unrotated input key and the value
  std::vector<model::certified::Ball> k_ball;      ///< [kv_width] rotated key (MPFR's value inside)
  std::vector<model::certified::Ball> v_ball;      ///< [kv_width] value (exact)
  std::vector<model::certified::Ball> deq_k_ball;  ///< [kv_width] reference-encoded key (exact)
  std::vector<model::certified::Ball> deq_v_ball;  ///< [kv_width] reference-encoded value (exact)
};

using RowKey = std::pair<std::int64_t, std::int64_t>;  // (request, position)

/// Everything kvcheck keeps for one layer: the model's rows and the shadow map.
template <class R>
struct LayerTruth {
  std::map<RowKey, TruthRow<R>> rows;
  ShadowMap shadow;
};

struct RequestState {
  std::int64_t state = 0;
  bool begun = false;
  scenarios::RequestProgress progress;
};

/// Accumulation precision of the production kernels per format.
double accumulation_epsilon(impl::ElementFormat f) {
  return f == impl::ElementFormat::kF64 ? 0x1.0p-53 : 0x1.0p-24;
}

template <class R>
model::Row<R> to_real(const double* x, std::int64_t n) {
  model::Row<R> r;
  r.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) r.emplace_back(x[i]);
  return r;
}

template <class R>
void rotate_heads(model::Row<R>& flat, std::int32_t heads, std::int32_t head_dim,
                  std::int64_t position, const model::Rope& rope) {
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
  std::vector<double> theta_d;               ///< theta as doubles (angle bounds)
  model::certified::RopeSteps steps;         ///< from theta, made on the first advance (169-bit sin/cos)
  model::certified::RopeTrack track;         ///< the last position's factors, carried on

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
      if (steps.c.size() != theta.size()) steps = model::certified::rope_steps(std::vector<model::Real50>(theta.begin(), theta.end()));
      model::certified::rope_advance(steps, &track);
    } else {
      model::certified::rope_anchor(theta, position, um, &track);
    }
    model::certified::rope_track_balls(track, theta_d, um, &it->second.cos_f, &it->second.sin_f);
    return it->second;
  }
};

std::vector<model::certified::Ball> exact_balls(const std::vector<double>& x) {
  std::vector<model::certified::Ball> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = model::certified::exact(x[i]);
  return out;
}

/// Every ball's double, when all are pinned (model::certified::pin_double).
bool pin_all(const std::vector<model::certified::Ball>& balls, std::vector<double>* out) {
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
bool pin_encoding(model::Encoding enc, const std::vector<model::certified::Ball>& balls,
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

std::string fmt_g(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

std::string list_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

model::Encoding model_encoding(scenarios::Format f) {
  switch (f) {
    case scenarios::Format::kF64: return model::Encoding::kF64;
    case scenarios::Format::kF32: return model::Encoding::kF32;
    case scenarios::Format::kBf16: return model::Encoding::kBf16;
    case scenarios::Format::kFp8: return model::Encoding::kFp8;
  }
  return model::Encoding::kF64;
}



std::string refusal_text(const engines::Refusal& r) { return r.code + (r.detail.empty() ? "" : ": " + r.detail); }

}  // namespace

namespace {
template <class Real>
RunObservation run_with(const Scenario& sc, const RunOptions& options, engines::CacheProvider& provider);
}  // namespace

std::unique_ptr<engines::CacheProvider> make_provider(const RunOptions& options) {
  engines::ExecOptions exec;
  exec.step_timeout_seconds = options.step_timeout_seconds;
  return engines::make_provider(options.backend, options.fault, exec);
}

RunObservation run_scenario(const Scenario& sc, const RunOptions& options) {
  std::unique_ptr<engines::CacheProvider> owned;
  engines::CacheProvider* provider = options.provider;
  if (provider == nullptr) {
    owned = make_provider(options);
    provider = owned.get();
  }
  switch (options.precision_bits) {
    case 53: return run_with<double>(sc, options, *provider);
    case 113: return run_with<model::Real>(sc, options, *provider);
    case 169: return run_with<model::Real50>(sc, options, *provider);
    default:
      throw Error(ErrorId::kUsage, "--precision",
                  "reference precision must be 53, 113 or 169 bits, got " +
                      std::to_string(options.precision_bits));
  }
}

std::int64_t window_keys(const scenarios::CacheConfig& cache) {
  const model::Window w{cache.window, to_model(cache.convention)};
  return *w.keys();
}

engines::CacheSpec cache_spec(const Scenario& scenario) {
  engines::CacheSpec spec;
  spec.cache = scenario.cache;
  spec.window_keys = window_keys(scenario.cache);
  std::int64_t most = 1;
  for (const auto& s : scenario.steps) most = std::max(most, scenarios::step_rows(s));
  spec.max_step_rows = most;
  spec.softmax_scale = scenario.cache.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(scenario.cache.head_dim)));
  return spec;
}

namespace {

/// Refusal probes: calls a correct cache must refuse, leaving it unchanged.
/// The generic ones are ordinary calls in a state where they are invalid;
/// the others are the cache's own (CacheUnderTest::probe).
struct Prober {
  const engines::Capabilities& caps;
  engines::CacheUnderTest& cache;
  std::int64_t sent = 0;

  /// The probes that apply before `step` of a request in `progress`.
  /// (The request has begun: the runner sends begin before any probe.)
  std::vector<std::string> applicable(const scenarios::Step& step, const scenarios::RequestProgress& progress) const {
    std::vector<std::string> out;
    const bool writes = scenarios::step_rows(step) > 0;
    for (const std::string& p : caps.probes) {
      if (p == "accept-without-verify" && !progress.pending()) out.push_back(p);
      else if (p == "accept-too-many" && progress.pending()) out.push_back(p);
      else if (p == "begin-busy-state") out.push_back(p);
      else if (p == "non-finite-row" && writes && !progress.pending()) out.push_back(p);
      else if (p != "accept-without-verify" && p != "accept-too-many" && p != "begin-busy-state" &&
               p != "non-finite-row" && step.kind == StepKind::kDecode) {
        out.push_back(p);  // the cache's own probes go in front of a decode
      }
    }
    return out;
  }

  /// Sends probe `name`; returns an empty string when it was refused and the
  /// cache is unchanged, else what went wrong.
  std::string run(const std::string& name, engines::StepCall call, const scenarios::RequestProgress& progress,
                  const std::vector<double>& k) {
    ++sent;
    const auto before = cache.fingerprint(call.layer);
    engines::StepStatus st;
    engines::StepAnswer scratch;
    if (name == "accept-without-verify" || name == "accept-too-many") {
      call.op = engines::StepCall::Op::kStep;
      call.step.kind = StepKind::kAccept;
      call.step.accepted = name == "accept-too-many" ? progress.pending_drafts + 1 : 0;
      call.rows = 0;
      st = cache.call(call, &scratch);
    } else if (name == "begin-busy-state") {
      call.op = engines::StepCall::Op::kBegin;
      call.step.request = call.step.request + (std::int64_t{1} << 40);  // an id no schedule uses
      st = cache.call(call, &scratch);
    } else if (name == "non-finite-row") {
      std::vector<double> k_bad = k;  // the step's keys with one NaN
      k_bad[0] = std::numeric_limits<double>::quiet_NaN();
      call.k = k_bad.data();
      st = cache.call(call, &scratch);
    } else {
      st = cache.probe(name, call);
    }
    if (!st) return "probe " + name + ": the cache accepted a call it must refuse";
    if (st->code == "unsupported-probe") return "probe " + name + ": " + st->detail;
    const auto after = cache.fingerprint(call.layer);
    if (before != after) {
      return "probe " + name + ": refused (" + refusal_text(*st) + ") but the cache's storage changed";
    }
    return {};
  }
};

template <class Real>
RunObservation run_with(const Scenario& sc, const RunOptions& options, engines::CacheProvider& provider) {
  const auto& cache = sc.cache;
  const engines::CacheSpec spec = cache_spec(sc);
  const std::int64_t keys = spec.window_keys;
  const model::Window window{cache.window, to_model(cache.convention)};
  const model::Heads heads{cache.q_heads, cache.kv_heads, cache.head_dim, cache.shared_row};
  const model::Rope rope{to_model(cache.rope.style), cache.rope.rotary_dims, cache.rope.base};
  using std::sqrt;
  const Real scale = cache.softmax_scale ? Real(*cache.softmax_scale)
                                         : Real(1) / sqrt(Real(cache.head_dim));
  const double scale_d = model::to_double(scale);
  const std::optional<Real> sink =
      cache.sink_logit ? std::optional<Real>(Real(*cache.sink_logit)) : std::nullopt;
  const std::int64_t kv_width = static_cast<std::int64_t>(cache.kv_heads) * cache.head_dim;
  const std::int64_t q_width = static_cast<std::int64_t>(cache.q_heads) * cache.head_dim;
  const impl::ElementFormat format = engines::impl_format(cache.format);

  RunObservation run;
  run.scenario_name = sc.name;
  run.backend = options.backend;
  run.fault = std::string(impl::fault_name(options.fault));
  run.window_convention = std::string(model::convention_name(window.convention));
  run.window_keys = keys;
  run.ring_rows = cache.ring_rows;
  run.format = std::string(impl::format_name(format));
  run.precision_bits = model::real_bits<Real>();

  const engines::Capabilities& caps = provider.capabilities();
  run.observed = caps.reports_written_slots && caps.reports_read_slots
                     ? "slots+outputs"
                     : (caps.reports_written_slots ? "written-slots+outputs" : "outputs");
  std::string why;
  if (!caps.supports(sc, &why)) {
    run.skipped = true;
    run.skip_reason = caps.name + " does not support " + why;
    return run;
  }
  engines::Refusal refused;
  std::unique_ptr<engines::CacheUnderTest> cut = provider.open(spec, &refused);
  if (!cut) {
    run.skipped = true;
    run.skip_reason = caps.name + " refused the configuration: " + refusal_text(refused);
    return run;
  }

  const double format_eps = impl::format_epsilon(format);
  const double accum_eps = accumulation_epsilon(format);
  const model::Encoding encoding = model_encoding(cache.format);
  const std::int32_t group = cache.q_heads / cache.kv_heads;

  // The certified reference (model/certified.hpp): double-double balls that
  // contain MPFR's values; MPFR only where a ball does not pin a figure.
  Certifier<Real> cert;
  cert.on = !std::is_same_v<Real, double> && options.reference == Reference::kCertified;
  if (cert.on) {
    cert.um = std::ldexp(1.0, -model::real_bits<Real>());
    cert.set_rope(rope);
    cert.scale = model::certified::from_real(scale);
    if (cache.sink_logit) cert.sink = *cache.sink_logit;
  }
  // A row in MPFR: the exact rotated key, its reference encoding and allowances.
  auto make_real_row = [&](TruthRow<Real>& row, std::int64_t p, const double* k, const double* v) {
    row.exact.k = to_real<Real>(k, kv_width);
    rotate_heads(row.exact.k, cache.kv_heads, cache.head_dim, p, rope);
    if (!cache.shared_row) row.exact.v = to_real<Real>(v, kv_width);
    row.key_encoding = model::encode_row(encoding, row.exact.k);
    row.dequantized.k = to_real<Real>(row.key_encoding.values.data(), kv_width);
    if (!cache.shared_row) {
      row.value_encoding = model::encode_row(encoding, row.exact.v);
      row.dequantized.v = to_real<Real>(row.value_encoding.values.data(), kv_width);
    }
    key_deviations(row.exact.k, row.key_encoding, cache.kv_heads, cache.head_dim, p, rope, encoding, accum_eps,
                   &row.key_dev, &row.key_err);
    if (!cert.on) return;
    row.k_ball.resize(row.exact.k.size());
    for (std::size_t e = 0; e < row.exact.k.size(); ++e) row.k_ball[e] = model::certified::from_real(row.exact.k[e]);
    row.deq_k_ball = exact_balls(row.key_encoding.values);
    if (!cache.shared_row) {
      row.v_in.assign(v, v + kv_width);
      row.v_ball = exact_balls(row.v_in);
      row.deq_v_ball = exact_balls(row.value_encoding.values);
    }
  };
  // The same row from balls, when they pin the key's doubles and encoding.
  auto certify_row = [&](TruthRow<Real>& row, std::int64_t p, const double* k, const double* v,
                         std::vector<double>* k_pinned) {
    const auto& f = cert.at(p);
    row.k_ball = model::certified::rotate_row(k, cache.kv_heads, cache.head_dim, rope, f.cos_f, f.sin_f, cert.um);
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
  };
  // The MPFR rows of a certified row, for a query that falls back.
  auto ensure_real = [&](TruthRow<Real>& row, std::int64_t p) {
    if (row.real_ready) return;
    row.exact.k = to_real<Real>(row.k_in.data(), kv_width);
    rotate_heads(row.exact.k, cache.kv_heads, cache.head_dim, p, rope);
    row.dequantized.k = to_real<Real>(row.key_encoding.values.data(), kv_width);
    if (!cache.shared_row) {
      row.exact.v = to_real<Real>(row.v_in.data(), kv_width);
      row.dequantized.v = to_real<Real>(row.value_encoding.values.data(), kv_width);
    }
    row.real_ready = true;
  };
  // The stored key judged: from the pinned doubles when that decides it (a
  // rotated element is judged against allowances narrowed by more than the
  // pinned value's and the double subtraction's error, so a pass there is a
  // pass in MPFR), else in MPFR.
  auto key_problem = [&](TruthRow<Real>& row, std::int64_t p, const std::vector<double>* k_pinned,
                         const double* stored, const std::uint8_t* bytes) {
    if (k_pinned != nullptr) {
      const bool rotated = std::any_of(row.key_dev.begin(), row.key_dev.end(), [](double d) { return d > 0; });
      if (!rotated) return check_stored_row(encoding, *k_pinned, row.key_dev, row.key_encoding, stored, bytes);
      std::vector<double> narrow = row.key_dev;
      bool usable = true;
      for (std::size_t e = 0; e < narrow.size(); ++e) {
        if (narrow[e] == 0) continue;
        const double m = (std::fabs((*k_pinned)[e]) + narrow[e]) * 0x1.0p-51 + 0x1.0p-1060;
        usable = usable && narrow[e] > m;
        narrow[e] -= m;
      }
      if (usable && check_stored_row(encoding, *k_pinned, narrow, row.key_encoding, stored, bytes).empty()) return std::string();
    }
    ensure_real(row, p);
    return check_stored_row(encoding, row.exact.k, row.key_dev, row.key_encoding, stored, bytes);
  };

  std::vector<LayerTruth<Real>> layers(static_cast<std::size_t>(cache.layers));
  std::map<std::int64_t, RequestState> requests;
  for (const auto& r : sc.requests) requests[r.id].state = r.state;
  Prober prober{caps, *cut};

  auto fail = [&run](const std::string& why_text) {
    if (run.passed) run.first_failure = why_text;
    run.passed = false;
  };
  // A step that ended the run early (a refusal, a probe the cache got wrong):
  // recorded as a failed observation so the verdict and the reports agree.
  auto stop_at = [&](std::size_t step_index, std::int32_t layer, const scenarios::Step& step,
                     const RequestState& req, const std::string& error) {
    StepObservation obs;
    obs.step = static_cast<std::int64_t>(step_index);
    obs.layer = layer;
    obs.kind = std::string(scenarios::step_kind_name(step.kind));
    obs.request = step.request;
    obs.state = req.state;
    obs.first_position = scenarios::step_first_position(req.progress);
    obs.error = error;
    run.steps.push_back(std::move(obs));
  };

  engines::StepAnswer answer;
  for (std::size_t step_index = 0; step_index < sc.steps.size(); ++step_index) {
    const auto& step = sc.steps[step_index];
    RequestState& req = requests.at(step.request);
    cert.factors.clear();
    const std::int64_t n = scenarios::step_rows(step);
    const std::int64_t first = scenarios::step_first_position(req.progress);
    bool stop = false;
    const RowSet rows = n > 0 ? make_rows(sc, 0, step.request, first, n, static_cast<std::int64_t>(step_index))
                              : RowSet{};

    for (std::int32_t l = 0; l < cache.layers && !stop; ++l) {
      LayerTruth<Real>& truth = layers[static_cast<std::size_t>(l)];
      const RowSet layer_rows =
          l == 0 ? RowSet{} : (n > 0 ? make_rows(sc, l, step.request, first, n, static_cast<std::int64_t>(step_index)) : RowSet{});
      const RowSet& in = l == 0 ? rows : layer_rows;
      engines::StepCall call;
      call.step = step;
      call.layer = l;
      call.state = req.state;
      call.position = first;
      call.rows = n;
      call.step_index = static_cast<std::int64_t>(step_index);
      if (n > 0) {
        call.k = in.k.data();
        call.v = cache.shared_row ? nullptr : in.v.data();
        call.q = in.q.data();
      }
      if (!req.begun) {
        engines::StepCall begin = call;
        begin.op = engines::StepCall::Op::kBegin;
        if (const auto st = cut->call(begin, nullptr)) {
          const std::string e = "begin refused: " + refusal_text(*st);
          fail("step " + std::to_string(step_index) + ": " + e);
          stop_at(step_index, l, step, req, e);
          stop = true;
          break;
        }
      }
      if (options.probes) {
        // One probe per step and layer, rotating through those that apply.
        const auto apply = prober.applicable(step, req.progress);
        if (!apply.empty()) {
          const std::string& name = apply[step_index % apply.size()];
          const std::string problem = prober.run(name, call, req.progress, in.k);
          if (!problem.empty()) {
            fail("step " + std::to_string(step_index) + " (" + std::string(scenarios::step_kind_name(step.kind)) + ") layer " +
                 std::to_string(l) + ": " + problem);
            stop_at(step_index, l, step, req, problem);
            stop = true;
            break;
          }
        }
      }
      if (n == 0) {
        if (const auto st = cut->call(call, nullptr)) {
          const std::string e = "refused: " + refusal_text(*st);
          fail("step " + std::to_string(step_index) + " (" + std::string(scenarios::step_kind_name(step.kind)) + "): " + e);
          stop_at(step_index, l, step, req, e);
          stop = true;
        }
        continue;
      }

      const engines::StepStatus st = cut->call(call, &answer);
      StepObservation obs;
      obs.step = static_cast<std::int64_t>(step_index);
      obs.layer = l;
      obs.kind = std::string(scenarios::step_kind_name(step.kind));
      if (step.kind == StepKind::kPrefill) {
        obs.order = scenarios::order_name(step.order);
      }
      obs.request = step.request;
      obs.state = req.state;
      obs.first_position = first;
      if (st) {
        obs.error = refusal_text(*st);
        fail("step " + std::to_string(step_index) + " (" + obs.kind + "): implementation refused: " + obs.error);
        run.steps.push_back(std::move(obs));
        stop = true;
        break;
      }
      KVCHECK_ASSERT(static_cast<std::int64_t>(answer.out.size()) == n * q_width);

      // Model: remember each row's exact and cached values.
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = first + i;
        const double* k_row = in.k.data() + i * kv_width;
        const double* v_row = cache.shared_row ? nullptr : in.v.data() + i * kv_width;
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
          ++obs.stored_rows_checked;
          const std::int64_t row_bytes = model::encoded_row_bytes(encoding, kv_width);
          const std::vector<double> no_dev(static_cast<std::size_t>(kv_width), 0.0);
          std::string problem =
              key_problem(row, p, certified_row ? &k_pinned : nullptr, answer.stored_k.data() + i * kv_width,
                          answer.has_stored_bytes ? answer.stored_k_bytes.data() + i * row_bytes : nullptr);
          std::string which = "key";
          if (problem.empty() && !cache.shared_row) {
            which = "value";
            // The value is exact input: judged the same from doubles as in MPFR.
            const double* stored_v = answer.stored_v.data() + i * kv_width;
            const std::uint8_t* stored_vb = answer.has_stored_bytes ? answer.stored_v_bytes.data() + i * row_bytes : nullptr;
            problem = row.real_ready ? check_stored_row(encoding, row.exact.v, no_dev, row.value_encoding, stored_v, stored_vb)
                                     : check_stored_row(encoding, row.v_in, no_dev, row.value_encoding, stored_v, stored_vb);
          }
          if (!problem.empty()) {
            if (obs.encoding_mismatches == 0) {
              obs.encoding_detail = "position " + std::to_string(p) + " stored " + which + " " + problem;
            }
            ++obs.encoding_mismatches;
          }
        }
        truth.rows[{step.request, p}] = std::move(row);
      }

      // Slots: everything from what the cache reported, via the shadow map.
      StepFacts facts;
      facts.request = step.request;
      facts.state = req.state;
      facts.first_position = first;
      facts.rows = n;
      facts.window_keys = keys;
      facts.has_written = answer.has_written;
      facts.written = answer.written;
      facts.has_reads = answer.has_reads;
      facts.read_offsets = answer.read_offsets;
      facts.read_slots = answer.read_slots;
      facts.view = answer.view;
      facts.duplicate_slots = answer.duplicate_slots;
      facts.ring = caps.ring_addressing;
      facts.ring_rows = cache.ring_rows;
      facts.record_reads = options.record_reads;
      facts.record_ring = options.record_ring;
      truth.shadow.observe(facts, &obs);

      for (std::int64_t i = 0; i < n && options.check_outputs; ++i) {
        QueryObservation& q = obs.queries[static_cast<std::size_t>(i)];
        const std::int64_t p = first + i;
        const model::PositionRange visible = model::visible_range(p, window);
        std::vector<TruthRow<Real>*> visible_rows;
        std::vector<KeyBounds> key_bounds;
        double vmax = 0;
        for (std::int64_t j = visible.first; j <= visible.last; ++j) {
          TruthRow<Real>& row = truth.rows.at({step.request, j});
          visible_rows.push_back(&row);
          key_bounds.push_back({&row.key_encoding.values, &row.key_err});
          for (const double x : cache.shared_row ? row.key_encoding.values : row.value_encoding.values) {
            vmax = std::max(vmax, std::fabs(x));
          }
        }
        // The reference outputs and the rotated query as the doubles MPFR's
        // values round to: from balls when they pin them, else from MPFR.
        std::vector<double> ref, ref_exact, query;
        bool pinned = false;
        if (cert.on) {
          const auto& f = cert.at(p);
          const auto q_ball = model::certified::rotate_row(in.q.data() + i * q_width, cache.q_heads, cache.head_dim,
                                                           rope, f.cos_f, f.sin_f, cert.um);
          std::vector<model::certified::Ball> out_deq(static_cast<std::size_t>(q_width)), out_exact(out_deq.size());
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
              model::certified::attend(q_ball.data() + at, exact_rows, cache.head_dim, cert.scale, cert.sink, cert.um,
                                       out_exact.data() + at);
            }
          }
          pinned = pin_all(q_ball, &query) && pin_all(out_deq, &ref) && pin_all(same ? out_deq : out_exact, &ref_exact);
        }
        if (!pinned) {
          if (!std::is_same_v<Real, double>) ++run.mpfr_queries;
          std::vector<const model::Projected<Real>*> exact, deq;
          for (std::int64_t j = visible.first; j <= visible.last; ++j) {
            TruthRow<Real>* row = visible_rows[static_cast<std::size_t>(j - visible.first)];
            ensure_real(*row, j);
            exact.push_back(&row->exact);
            deq.push_back(&row->dequantized);
          }
          model::Row<Real> query_real = to_real<Real>(in.q.data() + i * q_width, q_width);
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
        const double* out = answer.out.data() + i * q_width;
        for (std::int64_t d = 0; d < q_width; ++d) {
          const double r = ref[static_cast<std::size_t>(d)];
          const double diff = std::fabs(out[d] - r);
          q.abs_diff = std::max(q.abs_diff, diff);
          q.rel_diff = std::max(q.rel_diff, diff / std::max(std::fabs(r), 1e-30));
          q.quant_abs_diff = std::max(q.quant_abs_diff, std::fabs(out[d] - ref_exact[static_cast<std::size_t>(d)]));
          if (!std::isfinite(out[d])) q.abs_diff = std::numeric_limits<double>::infinity();
        }
        q.eps_units = q.abs_diff / format_eps;
        // Kernel error bound (model/error_bounds.hpp): accumulation rounding
        // over the visible rows, the head width and the logits' size, plus
        // what the RoPE angle error at the query's and keys' positions can
        // move the scores (and, for shared rows, the values) by.
        const model::OutputTolerance tol = query_tolerance(query, key_bounds, heads, scale_d, p, rope, accum_eps, vmax);
        q.rope_tolerance = tol.rope;
        q.tolerance = sc.expect && sc.expect->output_tolerance ? *sc.expect->output_tolerance : tol.total();
        const bool reads_correct = q.overwritten.empty() && q.missing.empty() && q.extra.empty();
        q.output_ok = !reads_correct || q.abs_diff <= q.tolerance;
      }
      run.steps.push_back(std::move(obs));
    }
    if (stop) break;

    // Rows no later query can see: every later query of this request sits at
    // or after this writing step's first position (an accept keeps at least
    // it; after a reset the positions are written again before they are
    // read), so a window reaches back no further than first - keys + 1.
    // Memory stays with the window, not the schedule's length.
    if (n > 0 && first - keys > 0) {
      for (LayerTruth<Real>& truth : layers) {
        truth.rows.erase(truth.rows.lower_bound({step.request, 0}), truth.rows.lower_bound({step.request, first - keys}));
      }
    }

    // Model bookkeeping shared by all layers (SPEC §3, scenarios/step_semantics.hpp).
    req.begun = true;
    const scenarios::StepRefusal refusal = scenarios::advance(req.progress, step);
    KVCHECK_ASSERT(refusal == scenarios::StepRefusal::kNone);  // scenarios are validated
  }
  run.probes = prober.sent;

  // The verdict, computed once: every query and step carries its own, the run
  // fails exactly when some step failed, and reports only read these fields.
  std::map<std::int64_t, const scenarios::OverwriteExpectation*> expected;
  if (sc.expect) {
    for (const auto& e : sc.expect->overwritten) expected[e.step] = &e;
  }
  const std::int64_t allowed = sc.expect && sc.expect->collisions ? *sc.expect->collisions : 0;
  std::int64_t collisions_so_far = 0;
  for (auto& obs : run.steps) {
    const auto it = expected.find(obs.step);
    std::vector<std::int64_t> counts;
    for (auto& q : obs.queries) {
      counts.push_back(static_cast<std::int64_t>(q.overwritten.size()));
      run.lost_rows += static_cast<std::int64_t>(q.overwritten.size() + q.missing.size());
      run.extra_reads += static_cast<std::int64_t>(q.extra.size());
      const bool reads_correct = q.overwritten.empty() && q.missing.empty() && q.extra.empty();
      // Output errors of queries that read wrong rows are reported per query
      // but not in the run's maxima, which describe the kernel's arithmetic.
      if (reads_correct) {
        run.max_rope_tolerance = std::max(run.max_rope_tolerance, q.rope_tolerance);
        run.max_abs_diff = std::max(run.max_abs_diff, q.abs_diff);
        run.max_eps_units = std::max(run.max_eps_units, q.eps_units);
        run.max_quant_abs_diff = std::max(run.max_quant_abs_diff, q.quant_abs_diff);
      }
      ++run.queries;
      // With an expectation for the step, its overwritten counts are judged
      // as a list; missing and extra reads still fail the query.
      const bool reads_fail = it != expected.end() ? (!q.missing.empty() || !q.extra.empty()) : !reads_correct;
      q.failed = !q.output_ok || reads_fail;
      if (!q.output_ok) {
        ++run.output_failures;
        fail("step " + std::to_string(obs.step) + " layer " + std::to_string(obs.layer) + " query " +
             std::to_string(q.position) + ": output differs by " + fmt_g(q.abs_diff) + " (tolerance " +
             fmt_g(q.tolerance) + ", " + fmt_g(q.eps_units) + " eps)");
      }
      if (reads_fail) {
        if (it == expected.end() && !obs.expectation_failed) {
          obs.expectation_failed = true;
          obs.expectation_detail = "query " + std::to_string(q.position) +
                                   " lost or misread rows, and the scenario expects none here";
        }
        fail("step " + std::to_string(obs.step) + " (" + obs.kind + ") layer " + std::to_string(obs.layer) +
             " query " + std::to_string(q.position) + ": overwritten " + list_text(q.overwritten) + ", missing " +
             list_text(q.missing) + ", " + std::to_string(q.extra.size()) + " extra reads");
      }
    }
    if (it != expected.end() && counts != it->second->counts) {
      obs.expectation_failed = true;
      obs.expectation_detail =
          "expected overwritten " + list_text(it->second->counts) + ", observed " + list_text(counts);
      fail("step " + std::to_string(obs.step) + " layer " + std::to_string(obs.layer) + ": " + obs.expectation_detail);
    }
    run.collisions += obs.collisions.total();
    collisions_so_far += obs.collisions.total();
    bool collision_fail = false;
    if (obs.collisions.total() > 0 && collisions_so_far > allowed) {
      // The first step past the allowed total fails, and every later step with collisions.
      collision_fail = true;
      fail("step " + std::to_string(obs.step) + " (" + obs.kind + "): " + std::to_string(obs.collisions.same_step) +
           " same-step, " + std::to_string(obs.collisions.outside_block) + " outside-block, " +
           std::to_string(obs.collisions.replaced_needed) + " replaced-needed collisions (expected " +
           std::to_string(allowed) + " in all)");
    }
    if (!obs.error.empty()) {
      fail("step " + std::to_string(obs.step) + " (" + obs.kind + "): " + obs.error);
    }
    run.stored_rows_checked += obs.stored_rows_checked;
    run.encoding_mismatches += obs.encoding_mismatches;
    if (obs.encoding_mismatches > 0) {
      fail("step " + std::to_string(obs.step) + " (" + obs.kind + ") layer " + std::to_string(obs.layer) + ": " +
           std::to_string(obs.encoding_mismatches) + " stored rows differ from the reference encoding; first: " +
           obs.encoding_detail);
    }
    obs.failed = collision_fail || obs.expectation_failed || !obs.error.empty() || obs.encoding_mismatches > 0 ||
                 std::any_of(obs.queries.begin(), obs.queries.end(), [](const QueryObservation& q) { return q.failed; });
  }
  if (run.collisions < allowed && !run.steps.empty()) {
    // Fewer collisions than the scenario expects: known only at the end, so
    // the last step carries it.
    auto& last = run.steps.back();
    last.failed = true;
    last.expectation_failed = true;
    last.expectation_detail = "expected " + std::to_string(allowed) + " collisions in all, observed " +
                              std::to_string(run.collisions);
    fail(last.expectation_detail);
  } else if (run.collisions < allowed) {
    fail("expected " + std::to_string(allowed) + " collisions, observed " + std::to_string(run.collisions));
  }
  run.first_failing_step = -1;
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    if (run.steps[i].failed) {
      run.first_failing_step = static_cast<std::int64_t>(i);
      break;
    }
  }
  // The one verdict: failed exactly when a step failed (a run with no steps
  // at all that expected collisions is the single exception, kept failed).
  if (run.first_failing_step >= 0) KVCHECK_ASSERT(!run.passed);
  if (run.first_failing_step < 0 && !run.steps.empty()) KVCHECK_ASSERT(run.passed);
  return run;
}

}  // namespace

}  // namespace kvcheck::properties
