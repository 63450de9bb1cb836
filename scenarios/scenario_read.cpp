// Scenario documents read: the text parsed into a SAX-built document
// (duplicate keys, depth and non-finite numbers caught with their path,
// scenarios/json_read.hpp), then converted strictly into a Scenario (types,
// unknown and missing keys), then validated (scenario_validate.cpp).
#include "scenarios/scenario_json.hpp"

#include <optional>
#include <string>
#include <vector>

#include "scenarios/expect_json.hpp"
#include "scenarios/json_read.hpp"
#include "support/error.hpp"

namespace kvcheck::scenarios {
namespace {

using namespace json_read;

// ---- document -> Scenario ----------------------------------------------------------

Rope read_rope(const json& j, const std::string& path) {
  as_object(j, path);
  check_keys(j, path, {"style", "rotary_dims", "base"});
  Rope rope;
  if (const json* v = find(j, "style")) {
    rope.style = get_enum(*v, join_key(path, "style"), kRopeStyles, rope_style_name);
  }
  if (const json* v = find(j, "rotary_dims")) rope.rotary_dims = get_i32(*v, join_key(path, "rotary_dims"));
  if (const json* v = find(j, "base")) rope.base = get_f64(*v, join_key(path, "base"));
  return rope;
}

/// `cache.layer_windows`: one entry per layer; a missing window is the
/// cache's `window`, null a global layer; a missing convention the cache's.
std::vector<LayerWindow> read_layer_windows(const json& j, const std::string& cache_path,
                                            const CacheConfig& c) {
  const std::string path = join_key(cache_path, "layer_windows");
  as_array(j, path);
  std::vector<LayerWindow> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string p = join_index(path, i);
    const json& e = as_object(j[i], p);
    check_keys(e, p, {"window", "convention"});
    LayerWindow w{c.window, c.convention};
    if (const json* v = find(e, "window")) {
      if (v->is_null()) {
        if (find(e, "convention") != nullptr) {
          fail(ErrorId::kJsonValue, join_key(p, "convention"),
               "a global layer (window null) sees every position and takes no convention");
        }
        w = LayerWindow{std::nullopt, Convention::kKeys};
      } else {
        w.window = get_i64(*v, join_key(p, "window"));
      }
    }
    if (const json* v = find(e, "convention")) {
      w.convention = get_enum(*v, join_key(p, "convention"), kConventions, convention_name);
    }
    out.push_back(w);
  }
  return out;
}

CacheConfig read_cache(const json& j, const std::string& path) {
  as_object(j, path);
  check_keys(j, path,
             {"window", "window_convention", "ring_rows", "states", "q_heads", "kv_heads", "head_dim",
              "shared_row", "format", "rope", "layers", "softmax_scale", "sink_logit", "layer_windows",
              "pool_blocks"});
  CacheConfig c;
  c.window = get_i64(require(j, path, "window"), join_key(path, "window"));
  c.ring_rows = get_i64(require(j, path, "ring_rows"), join_key(path, "ring_rows"));
  if (const json* v = find(j, "window_convention")) {
    c.convention = get_enum(*v, join_key(path, "window_convention"), kConventions, convention_name);
  }
  if (const json* v = find(j, "states")) c.states = get_i64(*v, join_key(path, "states"));
  if (const json* v = find(j, "q_heads")) c.q_heads = get_i32(*v, join_key(path, "q_heads"));
  if (const json* v = find(j, "kv_heads")) c.kv_heads = get_i32(*v, join_key(path, "kv_heads"));
  if (const json* v = find(j, "head_dim")) c.head_dim = get_i32(*v, join_key(path, "head_dim"));
  if (const json* v = find(j, "shared_row")) c.shared_row = get_bool(*v, join_key(path, "shared_row"));
  if (const json* v = find(j, "format")) {
    c.format = get_enum(*v, join_key(path, "format"), kElementFormats, format_name);
  }
  if (const json* v = find(j, "rope")) c.rope = read_rope(*v, join_key(path, "rope"));
  if (const json* v = find(j, "layers")) c.layers = get_i32(*v, join_key(path, "layers"));
  if (const json* v = find(j, "softmax_scale")) {
    c.softmax_scale = get_optional_f64(*v, join_key(path, "softmax_scale"));
  }
  if (const json* v = find(j, "sink_logit")) {
    c.sink_logit = get_optional_f64(*v, join_key(path, "sink_logit"));
  }
  if (const json* v = find(j, "layer_windows")) c.layer_windows = read_layer_windows(*v, path, c);
  if (const json* v = find(j, "pool_blocks")) c.pool_blocks = get_i64(*v, join_key(path, "pool_blocks"));
  return c;
}

Data read_data(const json& j, const std::string& path) {
  as_object(j, path);
  check_keys(j, path, {"seed", "profile", "rows"});
  Data d;
  if (const json* v = find(j, "seed")) d.seed = get_u64(*v, join_key(path, "seed"));
  if (const json* v = find(j, "profile")) {
    d.profile = get_enum(*v, join_key(path, "profile"), kValueProfiles, value_profile_name);
  }
  if (const json* v = find(j, "rows")) {
    const std::string rows_path = join_key(path, "rows");
    as_array(*v, rows_path);
    for (std::size_t i = 0; i < v->size(); ++i) {
      const std::string p = join_index(rows_path, i);
      const json& r = as_object((*v)[i], p);
      check_keys(r, p, {"layer", "request", "position", "step", "k", "v", "q"});
      ExplicitRow row;
      row.layer = get_i32(require(r, p, "layer"), join_key(p, "layer"));
      row.request = get_i64(require(r, p, "request"), join_key(p, "request"));
      row.position = get_i64(require(r, p, "position"), join_key(p, "position"));
      if (const json* vs = find(r, "step")) row.step = get_i64(*vs, join_key(p, "step"));
      row.k = get_f64_array(require(r, p, "k"), join_key(p, "k"));
      if (const json* vv = find(r, "v")) row.v = get_f64_array(*vv, join_key(p, "v"));
      row.q = get_f64_array(require(r, p, "q"), join_key(p, "q"));
      d.rows.push_back(std::move(row));
    }
  }
  return d;
}

std::vector<Request> read_requests(const json& j, const std::string& path) {
  as_array(j, path);
  std::vector<Request> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string p = join_index(path, i);
    const json& r = as_object(j[i], p);
    check_keys(r, p, {"id", "state", "prefix"});
    Request request;
    request.id = get_i64(require(r, p, "id"), join_key(p, "id"));
    request.state = get_i64(require(r, p, "state"), join_key(p, "state"));
    if (const json* x = find(r, "prefix")) {
      const std::string pp = join_key(p, "prefix");
      const json& o = as_object(*x, pp);
      check_keys(o, pp, {"request", "positions"});
      request.prefix = Prefix{get_i64(require(o, pp, "request"), join_key(pp, "request")),
                              get_i64(require(o, pp, "positions"), join_key(pp, "positions"))};
    }
    out.push_back(request);
  }
  return out;
}

Step read_step(const json& j, const std::string& p) {
  as_object(j, p);
  Step step;
  step.kind = get_enum(require(j, p, "kind"), join_key(p, "kind"), kStepKinds, step_kind_name);
  const std::string owner = "a " + std::string(step_kind_name(step.kind)) + " step";
  const StepFields fields = step_kind_fields(step.kind);
  switch (fields) {
    case StepFields::kRowsOrder: check_keys(j, p, {"kind", "request", "rows", "order"}, owner); break;
    case StepFields::kDrafts: check_keys(j, p, {"kind", "request", "drafts"}, owner); break;
    case StepFields::kAccepted: check_keys(j, p, {"kind", "request", "accepted"}, owner); break;
    case StepFields::kPositions: check_keys(j, p, {"kind", "request", "positions"}, owner); break;
    case StepFields::kNone: check_keys(j, p, {"kind", "request"}, owner); break;
  }
  step.request = get_i64(require(j, p, "request"), join_key(p, "request"));
  switch (fields) {
    case StepFields::kRowsOrder:
      step.rows = get_i64(require(j, p, "rows"), join_key(p, "rows"));
      step.order = get_enum(require(j, p, "order"), join_key(p, "order"), kOrders, order_name);
      break;
    case StepFields::kDrafts: step.drafts = get_i64(require(j, p, "drafts"), join_key(p, "drafts")); break;
    case StepFields::kAccepted:
      step.accepted = get_i64(require(j, p, "accepted"), join_key(p, "accepted"));
      break;
    case StepFields::kPositions:
      step.positions = get_i64(require(j, p, "positions"), join_key(p, "positions"));
      break;
    case StepFields::kNone: break;
  }
  return step;
}

Scenario read_scenario(const json& root) {
  const std::string path;
  as_object(root, path);
  check_keys(root, path,
             {"schema_version", "name", "description", "cache", "data", "requests", "steps", "expect"});
  const json& version = require(root, path, "schema_version");
  if (get_i64(version, "schema_version") != Scenario::kSchemaVersion) {
    fail(ErrorId::kJsonValue, "schema_version",
         "unsupported schema_version " + version.dump() + " (this build reads " +
             std::to_string(Scenario::kSchemaVersion) + ")");
  }
  Scenario s;
  s.name = get_string(require(root, path, "name"), "name");
  s.description = get_string(require(root, path, "description"), "description");
  s.cache = read_cache(require(root, path, "cache"), "cache");
  if (const json* v = find(root, "data")) s.data = read_data(*v, "data");
  s.requests = read_requests(require(root, path, "requests"), "requests");
  const json& steps = as_array(require(root, path, "steps"), "steps");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    s.steps.push_back(read_step(steps[i], join_index("steps", i)));
  }
  if (const json* v = find(root, "expect")) s.expect = read_expectations(*v, "expect");
  return s;
}

}  // namespace

Scenario parse_scenario(std::string_view text, const std::string& source) {
  try {
    const json root = parse_document(text, /*one_line=*/false);
    Scenario s = read_scenario(root);
    validate_scenario(s);
    return s;
  } catch (const Error& e) {
    if (source.empty()) throw;
    // Re-issue with the source named after the rule; where() stays the path.
    throw Error(e.id(), e.where(), e.rule() + " (in " + source + ")");
  }
}

}  // namespace kvcheck::scenarios
