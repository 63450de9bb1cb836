// Scenario -> canonical text: the document in a fixed key order, printed
// with short arrays on one line, so a saved scenario reads the same on every
// machine and round-trips through parse_scenario byte for byte.
#include "scenarios/scenario_json.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "scenarios/expect_json.hpp"
#include "scenarios/json_read.hpp"

namespace kvcheck::scenarios {
namespace {

using namespace json_read;
using ojson = nlohmann::ordered_json;

// ---- Scenario -> canonical text ----------------------------------------------------------

ojson to_document(const Scenario& s) {
  ojson root = ojson::object();
  root["schema_version"] = Scenario::kSchemaVersion;
  root["name"] = s.name;
  root["description"] = s.description;
  const CacheConfig& c = s.cache;
  ojson cache = ojson::object();
  cache["window"] = c.window;
  cache["window_convention"] = convention_name(c.convention);
  cache["ring_rows"] = c.ring_rows;
  cache["states"] = c.states;
  cache["q_heads"] = c.q_heads;
  cache["kv_heads"] = c.kv_heads;
  cache["head_dim"] = c.head_dim;
  cache["shared_row"] = c.shared_row;
  cache["format"] = format_name(c.format);
  cache["rope"] = rope_document(c.rope);
  cache["layers"] = c.layers;
  cache["softmax_scale"] = optional_number(c.softmax_scale);
  cache["sink_logit"] = optional_number(c.sink_logit);
  if (!c.layer_windows.empty()) {  // only when listed: files without them keep their text
    ojson layers = ojson::array();
    for (const LayerWindow& w : c.layer_windows) {
      ojson entry = ojson::object();
      if (w.window) {
        entry["window"] = *w.window;
        entry["convention"] = convention_name(w.convention);
      } else {
        entry["window"] = nullptr;
      }
      layers.push_back(std::move(entry));
    }
    cache["layer_windows"] = std::move(layers);
  }
  if (c.pool_blocks) cache["pool_blocks"] = *c.pool_blocks;  // only when given, like layer_windows
  root["cache"] = std::move(cache);

  ojson data = ojson::object();
  data["seed"] = s.data.seed;
  // Only when not uniform: files written before profiles keep their text.
  if (s.data.profile != ValueProfile::kUniform) data["profile"] = value_profile_name(s.data.profile);
  ojson rows = ojson::array();
  for (const ExplicitRow& r : s.data.rows) {
    ojson row = ojson::object();
    row["layer"] = r.layer;
    row["request"] = r.request;
    row["position"] = r.position;
    if (r.step) row["step"] = *r.step;  // only when set: files without steps keep their text
    row["k"] = r.k;
    row["v"] = r.v;
    row["q"] = r.q;
    rows.push_back(std::move(row));
  }
  data["rows"] = std::move(rows);
  root["data"] = std::move(data);

  ojson requests = ojson::array();
  for (const Request& r : s.requests) {
    ojson request = ojson::object();
    request["id"] = r.id;
    request["state"] = r.state;
    if (r.prefix) request["prefix"] = ojson{{"request", r.prefix->request}, {"positions", r.prefix->positions}};
    requests.push_back(std::move(request));
  }
  root["requests"] = std::move(requests);

  ojson steps = ojson::array();
  for (const Step& st : s.steps) {
    ojson step = ojson::object();
    step["kind"] = step_kind_name(st.kind);
    step["request"] = st.request;
    switch (step_kind_fields(st.kind)) {
      case StepFields::kRowsOrder:
        step["rows"] = st.rows;
        step["order"] = order_name(st.order);
        break;
      case StepFields::kDrafts: step["drafts"] = st.drafts; break;
      case StepFields::kAccepted: step["accepted"] = st.accepted; break;
      case StepFields::kPositions: step["positions"] = st.positions; break;
      case StepFields::kNone: break;
    }
    steps.push_back(std::move(step));
  }
  root["steps"] = std::move(steps);

  root["expect"] = s.expect ? expectations_document(*s.expect) : ojson(nullptr);
  return root;
}

bool is_scalar_array(const ojson& j) {
  return j.is_array() && std::all_of(j.begin(), j.end(), [](const ojson& e) { return e.is_primitive(); });
}

/// Flat containers (children are scalars or arrays of scalars) print on one line.
bool is_flat(const ojson& j) {
  return std::all_of(j.begin(), j.end(),
                     [](const ojson& e) { return e.is_primitive() || is_scalar_array(e); });
}

void print(const ojson& j, int indent, std::string& out) {
  if (j.is_primitive()) {
    // Doubles print as the shortest text that reads back to the same value
    // (and always with a '.' or exponent, so they stay doubles).
    out += j.dump(-1, ' ', false, ojson::error_handler_t::strict);
    return;
  }
  const bool object = j.is_object();
  const char open = object ? '{' : '[';
  const char close = object ? '}' : ']';
  if (j.empty()) {
    out += open;
    out += close;
    return;
  }
  const bool flat = is_flat(j);
  const std::string pad(static_cast<std::size_t>(indent + 2), ' ');
  out += open;
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out += ',';
    first = false;
    if (flat) {
      if (it != j.begin()) out += ' ';
    } else {
      out += '\n';
      out += pad;
    }
    if (object) {
      out += ojson(it.key()).dump(-1, ' ', false, ojson::error_handler_t::strict);
      out += ": ";
    }
    print(*it, indent + 2, out);
  }
  if (!flat) {
    out += '\n';
    out += std::string(static_cast<std::size_t>(indent), ' ');
  }
  out += close;
}

}  // namespace

std::string save_scenario(const Scenario& scenario) {
  validate_scenario(scenario);
  std::string out;
  print(to_document(scenario), 0, out);
  out += '\n';
  return out;
}

}  // namespace kvcheck::scenarios
