#include "scenarios/expect_json.hpp"

#include <utility>

#include "scenarios/json_read.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

namespace kvcheck::scenarios {

using namespace json_read;
using ojson = nlohmann::ordered_json;

std::optional<Expectations> read_expectations(const json& j, const std::string& path) {
  if (j.is_null()) return std::nullopt;
  if (!j.is_object()) type_error(j, path, "an object or null");
  check_keys(j, path, {"overwritten", "collisions", "output_tolerance"});
  Expectations e;
  if (const json* v = find(j, "overwritten")) {
    const std::string list_path = join_key(path, "overwritten");
    as_array(*v, list_path);
    for (std::size_t i = 0; i < v->size(); ++i) {
      const std::string p = join_index(list_path, i);
      const json& o = as_object((*v)[i], p);
      check_keys(o, p, {"step", "counts"});
      OverwriteExpectation ow;
      ow.step = get_i64(require(o, p, "step"), join_key(p, "step"));
      const std::string counts_path = join_key(p, "counts");
      const json& counts = as_array(require(o, p, "counts"), counts_path);
      for (std::size_t c = 0; c < counts.size(); ++c) {
        ow.counts.push_back(get_i64(counts[c], join_index(counts_path, c)));
      }
      e.overwritten.push_back(std::move(ow));
    }
  }
  if (const json* v = find(j, "collisions"); v != nullptr && !v->is_null()) {
    e.collisions = get_i64(*v, join_key(path, "collisions"));
  }
  if (const json* v = find(j, "output_tolerance")) {
    e.output_tolerance = get_optional_f64(*v, join_key(path, "output_tolerance"));
  }
  return e;
}

ojson expectations_document(const Expectations& e) {
  ojson expect = ojson::object();
  ojson overwritten = ojson::array();
  for (const OverwriteExpectation& o : e.overwritten) {
    ojson entry = ojson::object();
    entry["step"] = o.step;
    entry["counts"] = o.counts;
    overwritten.push_back(std::move(entry));
  }
  expect["overwritten"] = std::move(overwritten);
  expect["collisions"] = e.collisions ? ojson(*e.collisions) : ojson(nullptr);
  expect["output_tolerance"] = e.output_tolerance ? ojson(*e.output_tolerance) : ojson(nullptr);
  return expect;
}

ojson rope_document(const Rope& rope) {
  ojson j = ojson::object();
  j["style"] = rope_style_name(rope.style);
  j["rotary_dims"] = rope.rotary_dims;
  j["base"] = rope.base;
  return j;
}

ojson optional_number(const std::optional<double>& v) {
  return v ? ojson(*v) : ojson(nullptr);
}

}  // namespace kvcheck::scenarios
