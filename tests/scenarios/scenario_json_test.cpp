// Tests for the scenario JSON format: bundled files are canonical and carry
// the docs/semantics.md "Golden values" expectations, malformed inputs fail with the right error id and
// JSON path, writes are atomic, and random valid scenarios round-trip.
#include "scenarios/scenario_json.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <rapidcheck.h>
#include <rapidcheck/catch.h>
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "scenarios/step_semantics.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"
#include "support/formats.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvcheck::Error;
using kvcheck::ErrorId;
using namespace kvcheck::scenarios;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

fs::path bundled(const std::string& name) {
  return fs::path(KVCHECK_SCENARIO_DIR) / "fast" / (name + ".json");
}

/// A fresh empty directory under the system temp dir, removed on scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("kvcheck-scen-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
};

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

/// Runs `f`, which must throw kvcheck::Error; returns it.
template <typename F>
Error catch_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no kvcheck::Error thrown");
  return Error(ErrorId::kUsage, "", "");
}

// A small valid document touching every section.
const char* const kBase = R"({
  "schema_version": 1, "name": "base", "description": "test base",
  "cache": {"window": 4, "ring_rows": 6, "states": 2, "q_heads": 2, "kv_heads": 1, "head_dim": 2},
  "data": {"seed": 1, "rows": [{"layer": 0, "request": 0, "position": 1, "k": [1, 2], "v": [3, 4], "q": [1, 2, 3, 4]}]},
  "requests": [{"id": 0, "state": 0}, {"id": 1, "state": 1}],
  "steps": [{"kind": "prefill", "request": 0, "rows": 3, "order": "load_then_store"},
            {"kind": "decode", "request": 1},
            {"kind": "verify", "request": 0, "drafts": 2},
            {"kind": "accept", "request": 0, "accepted": 1},
            {"kind": "finish", "request": 0}],
  "expect": {"overwritten": [{"step": 2, "counts": [0, 0, 0]}], "collisions": 0, "output_tolerance": 1e-6}
})";

json base() {
  return json::parse(kBase);
}

}  // namespace

TEST_CASE("Scenarios: the base document of the error table is valid") {
  const Scenario s = parse_scenario(kBase, "base");
  CHECK(s.cache.q_heads == 2);
  CHECK(s.cache.format == Format::kF64);  // default
  CHECK(s.steps.size() == 5);
  REQUIRE(s.expect);
  CHECK(s.expect->output_tolerance == 1e-6);
}

TEST_CASE(
    "Scenarios: every format of the table round-trips through its name, a scenario file and the schemas") {
  std::vector<std::string> names;
  for (const Format f : kvcheck::kElementFormats) {
    const std::string name(kvcheck::format_name(f));
    INFO(name);
    Format back = f == Format::kF64 ? Format::kF32 : Format::kF64;
    CHECK(kvcheck::parse_format(name, &back));
    CHECK(back == f);
    json doc = base();
    doc["cache"]["format"] = name;
    const Scenario s = parse_scenario(doc.dump(), "format");
    CHECK(s.cache.format == f);
    CHECK(json::parse(save_scenario(s))["cache"]["format"] == name);
    names.push_back(name);
  }
  CHECK(static_cast<int>(names.size()) == kvcheck::kElementFormatCount);
  Format untouched = Format::kBf16;
  CHECK_FALSE(kvcheck::parse_format("fp16", &untouched));
  CHECK(untouched == Format::kBf16);
  // The schemas list the formats by hand: every list that names three or
  // more formats (not "accumulation": f32, f64; not an output format list)
  // names them all, in table order (a new format is added there too).
  for (const char* schema : {"scenario.schema.json", "trace.schema.json", "exec-protocol.schema.json"}) {
    INFO(schema);
    int lists = 0;
    const std::function<void(const json&)> walk = [&](const json& j) {
      const auto named = [&j] {
        return std::count_if(j.begin(), j.end(), [](const json& e) {
          Format f = Format::kF64;
          return e.is_string() && kvcheck::parse_format(e.get<std::string>(), &f);
        });
      };
      // A list of output formats (exec hello "output_format": f64, f32,
      // bf16, fp16) is the output table's, in its order.
      const auto output_formats = [&j] {
        return std::all_of(j.begin(), j.end(), [](const json& e) {
          kvcheck::OutputFormat f = kvcheck::OutputFormat::kAccumulation;
          return e.is_string() && kvcheck::parse_output_format(e.get<std::string>(), &f);
        });
      };
      if (j.is_array() && named() >= 3 && output_formats()) {
        CHECK(j.get<std::vector<std::string>>() == std::vector<std::string>{"f64", "f32", "bf16", "fp16"});
      } else if (j.is_array() && named() >= 3) {
        ++lists;
        CHECK(j.get<std::vector<std::string>>() == names);
      }
      if (j.is_structured())
        for (const json& child : j) walk(child);
    };
    walk(json::parse(read_text(fs::path(KVCHECK_SCENARIO_DIR) / "schema" / schema)));
    CHECK(lists >= 1);
  }
}

TEST_CASE("Scenarios: every bundled file loads, is canonical and carries expectations") {
  const auto files = collect_scenario_files({std::string(KVCHECK_SCENARIO_DIR) + "/fast"});
  REQUIRE(files.size() >= 16);
  for (const fs::path& file : files) {
    DYNAMIC_SECTION(file.filename().string()) {
      const std::string text = read_text(file);
      const Scenario s = load_scenario_file(file);
      CHECK(save_scenario(s) == text);
      CHECK(parse_scenario(save_scenario(s), "") == s);
      CHECK(s.name == file.stem().string());
      CHECK_FALSE(s.description.empty());
      REQUIRE(s.expect.has_value());
      CHECK_FALSE(s.expect->overwritten.empty());
    }
  }
}

TEST_CASE("Scenarios: bundled files carry the golden counts") {
  const auto counts = [](const std::string& name, std::int64_t step) {
    const Scenario s = load_scenario_file(bundled(name));
    for (const auto& o : s.expect->overwritten) {
      if (o.step == step) return o.counts;
    }
    return std::vector<std::int64_t>{};
  };
  using V = std::vector<std::int64_t>;
  CHECK(counts("verify-s128", 2) == V{5, 4, 3, 2, 1, 0});
  CHECK(counts("verify-s133", 2) == V{0, 0, 0, 0, 0, 0});
  CHECK(counts("verify-s134", 2) == V{0, 0, 0, 0, 0, 0});
  CHECK(counts("prefill-w3-s5-store-then-load-4-6", 1) == V{0, 0, 0});
  CHECK(counts("prefill-w3-s5-store-then-load-4-7", 1) == V{1, 0, 0, 0});
  CHECK(counts("prefill-w3-s5-store-then-load-4-8", 1) == V{2, 1, 0, 0, 0});
  CHECK(counts("prefill-w3-s5-load-then-store-4-6", 1) == V{0, 0, 0});
  CHECK(counts("prefill-w3-s5-load-then-store-4-7", 1) == V{0, 0, 0, 0});
  CHECK(counts("prefill-w3-s5-load-then-store-4-8", 1) == V{0, 0, 0, 0, 0});

  const Scenario ring = load_scenario_file(bundled("ring-trace-w128-s134-state2"));
  CHECK(ring.cache.window == 128);
  CHECK(ring.cache.ring_rows == 134);
  CHECK(ring.cache.states == 3);
  CHECK(ring.requests.at(0).state == 2);

  for (const char* name : {"attention-lab-full", "attention-lab-window3"}) {
    const Scenario lab = load_scenario_file(bundled(name));
    REQUIRE(lab.data.rows.size() == 5);
    const double in[5][2] = {{1, 0}, {0, 1}, {1, 1}, {2, 0}, {0, 2}};
    for (int p = 0; p < 5; ++p) {
      const double a = in[p][0], b = in[p][1];
      const ExplicitRow& row = lab.data.rows[static_cast<std::size_t>(p)];
      CHECK(row.position == p);
      CHECK(row.q == std::vector<double>{a, b});
      CHECK(row.k == std::vector<double>{a - b, a + b});
      CHECK(row.v == std::vector<double>{a + 2 * b, 2 * a - b});
    }
    CHECK(lab.cache.ring_rows == lab.cache.window);
    CHECK(lab.steps.size() == 5);
  }
}

TEST_CASE("Scenarios: an error names its id, JSON path, rule and source") {
  json j = base();
  j["steps"][3]["accepted"] = 4;
  const Error e = catch_error([&] { parse_scenario(j.dump(), "scenarios/x.json"); });
  CHECK(e.id() == ErrorId::kJsonValue);
  CHECK(e.where() == "steps[3].accepted");
  CHECK(std::string(e.what()) ==
        "kvcheck error 204 at steps[3].accepted: accept 4 exceeds the 2 drafts of the pending "
        "verify at steps[2] (in scenarios/x.json)");
}

namespace {

struct BadCase {
  const char* label;
  std::function<void(json&)> mutate;
  ErrorId id;
  const char* where;
};

json& at(json& j, const char* pointer) {
  return j[json::json_pointer(pointer)];
}

std::function<void(json&)> set(const char* pointer, json value) {
  return [pointer, value](json& j) { at(j, pointer) = value; };
}

std::function<void(json&)> erase(const char* parent, const char* key) {
  return [parent, key](json& j) { at(j, parent).erase(key); };
}

}  // namespace

TEST_CASE("Scenarios: malformed documents fail with the right id and path") {
  const std::int64_t big = std::int64_t{1} << 39;
  const std::vector<BadCase> cases = {
      // types
      {"schema_version as string", set("/schema_version", "1"), ErrorId::kJsonType, "schema_version"},
      {"name as number", set("/name", 5), ErrorId::kJsonType, "name"},
      {"cache as array", set("/cache", json::array()), ErrorId::kJsonType, "cache"},
      {"window as string", set("/cache/window", "4"), ErrorId::kJsonType, "cache.window"},
      {"window fractional", set("/cache/window", 4.5), ErrorId::kJsonType, "cache.window"},
      {"window 4.0", set("/cache/window", 4.0), ErrorId::kJsonType, "cache.window"},
      {"shared_row as int", set("/cache/shared_row", 1), ErrorId::kJsonType, "cache.shared_row"},
      {"softmax_scale as string", set("/cache/softmax_scale", "x"), ErrorId::kJsonType, "cache.softmax_scale"},
      {"rope as string", set("/cache/rope", "neox"), ErrorId::kJsonType, "cache.rope"},
      {"steps as object", set("/steps", json::object()), ErrorId::kJsonType, "steps"},
      {"step as array", set("/steps/1", json::array()), ErrorId::kJsonType, "steps[1]"},
      {"row value as string", set("/data/rows/0/k/1", "2"), ErrorId::kJsonType, "data.rows[0].k[1]"},
      {"seed negative", set("/data/seed", -1), ErrorId::kJsonValue, "data.seed"},
      {"seed as string", set("/data/seed", "7"), ErrorId::kJsonType, "data.seed"},
      {"collisions fractional", set("/expect/collisions", 1.5), ErrorId::kJsonType, "expect.collisions"},
      {"expect as array", set("/expect", json::array()), ErrorId::kJsonType, "expect"},
      {"count as null", set("/expect/overwritten/0/counts/2", nullptr), ErrorId::kJsonType, "expect.overwritten[0].counts[2]"},
      {"NaN spelled as string", set("/data/rows/0/k/0", "NaN"), ErrorId::kJsonType, "data.rows[0].k[0]"},
      // unknown keys at several depths
      {"unknown root key", set("/extra", 1), ErrorId::kJsonUnknownKey, "extra"},
      {"unknown cache key", set("/cache/win", 1), ErrorId::kJsonUnknownKey, "cache.win"},
      {"unknown rope key", set("/cache/rope", json{{"style", "none"}, {"theta", 1}}), ErrorId::kJsonUnknownKey, "cache.rope.theta"},
      {"unknown row key", set("/data/rows/0/w", json::array()), ErrorId::kJsonUnknownKey, "data.rows[0].w"},
      {"unknown request key", set("/requests/1/slot", 0), ErrorId::kJsonUnknownKey, "requests[1].slot"},
      {"rows on a decode step", set("/steps/1/rows", 1), ErrorId::kJsonUnknownKey, "steps[1].rows"},
      {"drafts on an accept step", set("/steps/3/drafts", 2), ErrorId::kJsonUnknownKey, "steps[3].drafts"},
      {"unknown expectation key", set("/expect/overwritten/0/query", 0), ErrorId::kJsonUnknownKey, "expect.overwritten[0].query"},
      {"unknown expect key", set("/expect/lost", 0), ErrorId::kJsonUnknownKey, "expect.lost"},
      // missing keys
      {"no schema_version", erase("", "schema_version"), ErrorId::kJsonMissingKey, "schema_version"},
      {"no description", erase("", "description"), ErrorId::kJsonMissingKey, "description"},
      {"no cache", erase("", "cache"), ErrorId::kJsonMissingKey, "cache"},
      {"no window", erase("/cache", "window"), ErrorId::kJsonMissingKey, "cache.window"},
      {"no ring_rows", erase("/cache", "ring_rows"), ErrorId::kJsonMissingKey, "cache.ring_rows"},
      {"no steps", erase("", "steps"), ErrorId::kJsonMissingKey, "steps"},
      {"no step kind", erase("/steps/1", "kind"), ErrorId::kJsonMissingKey, "steps[1].kind"},
      {"no prefill order", erase("/steps/0", "order"), ErrorId::kJsonMissingKey, "steps[0].order"},
      {"no verify drafts", erase("/steps/2", "drafts"), ErrorId::kJsonMissingKey, "steps[2].drafts"},
      {"no request state", erase("/requests/1", "state"), ErrorId::kJsonMissingKey, "requests[1].state"},
      // shared prefixes (request 0 has committed 3 positions when request 1 begins)
      {"prefix as number", set("/requests/1/prefix", 3), ErrorId::kJsonType, "requests[1].prefix"},
      {"prefix unknown key", set("/requests/1/prefix", json{{"request", 0}, {"positions", 2}, {"start", 0}}), ErrorId::kJsonUnknownKey, "requests[1].prefix.start"},
      {"prefix without positions", set("/requests/1/prefix", json{{"request", 0}}), ErrorId::kJsonMissingKey, "requests[1].prefix.positions"},
      {"prefix of 0 positions", set("/requests/1/prefix", json{{"request", 0}, {"positions", 0}}), ErrorId::kJsonValue, "requests[1].prefix.positions"},
      {"prefix past the committed length", set("/requests/1/prefix", json{{"request", 0}, {"positions", 4}}), ErrorId::kJsonValue, "requests[1].prefix.positions"},
      {"prefix of itself", set("/requests/1/prefix", json{{"request", 1}, {"positions", 1}}), ErrorId::kJsonValue, "requests[1].prefix.request"},
      {"prefix of a request not begun", set("/requests/0/prefix", json{{"request", 1}, {"positions", 1}}), ErrorId::kJsonValue, "requests[0].prefix.request"},
      {"no row k", erase("/data/rows/0", "k"), ErrorId::kJsonMissingKey, "data.rows[0].k"},
      {"no expectation counts", erase("/expect/overwritten/0", "counts"), ErrorId::kJsonMissingKey, "expect.overwritten[0].counts"},
      // enum names and versions
      {"schema_version 2", set("/schema_version", 2), ErrorId::kJsonValue, "schema_version"},
      {"bad format", set("/cache/format", "fp16"), ErrorId::kJsonValue, "cache.format"},
      {"bad convention", set("/cache/window_convention", "right"), ErrorId::kJsonValue, "cache.window_convention"},
      // per-layer windows (the base document has one layer)
      {"layer_windows as object", set("/cache/layer_windows", json::object()), ErrorId::kJsonType, "cache.layer_windows"},
      {"layer window as number", set("/cache/layer_windows", json::array({3})), ErrorId::kJsonType, "cache.layer_windows[0]"},
      {"layer window as string", set("/cache/layer_windows", json::array({json{{"window", "3"}}})), ErrorId::kJsonType, "cache.layer_windows[0].window"},
      {"layer window 0", set("/cache/layer_windows", json::array({json{{"window", 0}}})), ErrorId::kSize, "cache.layer_windows[0].window"},
      {"layer window unknown key", set("/cache/layer_windows", json::array({json{{"keys", 3}}})), ErrorId::kJsonUnknownKey, "cache.layer_windows[0].keys"},
      {"layer window bad convention", set("/cache/layer_windows", json::array({json{{"window", 3}, {"convention", "right"}}})), ErrorId::kJsonValue, "cache.layer_windows[0].convention"},
      {"global layer with a convention", set("/cache/layer_windows", json::array({json{{"window", nullptr}, {"convention", "left"}}})), ErrorId::kJsonValue, "cache.layer_windows[0].convention"},
      {"two layer windows for one layer", set("/cache/layer_windows", json::array({json::object(), json{{"window", nullptr}}})), ErrorId::kJsonValue, "cache.layer_windows"},
      {"bad rope style", set("/cache/rope", json{{"style", "yarn"}}), ErrorId::kJsonValue, "cache.rope.style"},
      // a paged pool
      {"pool_blocks 0", set("/cache/pool_blocks", 0), ErrorId::kSize, "cache.pool_blocks"},
      {"pool_blocks as string", set("/cache/pool_blocks", "4"), ErrorId::kJsonType, "cache.pool_blocks"},
      {"bad step kind", set("/steps/1/kind", "decod"), ErrorId::kJsonValue, "steps[1].kind"},
      {"bad order", set("/steps/0/order", "store_first"), ErrorId::kJsonValue, "steps[0].order"},
      {"empty name", set("/name", ""), ErrorId::kJsonValue, "name"},
      {"control character in name", set("/name", "a\nb"), ErrorId::kJsonValue, "name"},
      // sizes
      {"window 0", set("/cache/window", 0), ErrorId::kSize, "cache.window"},
      {"window negative", set("/cache/window", -3), ErrorId::kSize, "cache.window"},
      {"window 2^40", set("/cache/window", std::int64_t{1} << 40), ErrorId::kSize, "cache.window"},
      {"ring_rows 0", set("/cache/ring_rows", 0), ErrorId::kSize, "cache.ring_rows"},
      {"states 0", set("/cache/states", 0), ErrorId::kSize, "cache.states"},
      {"q_heads 0", set("/cache/q_heads", 0), ErrorId::kSize, "cache.q_heads"},
      {"kv_heads 0", set("/cache/kv_heads", 0), ErrorId::kSize, "cache.kv_heads"},
      {"head_dim 0", set("/cache/head_dim", 0), ErrorId::kSize, "cache.head_dim"},
      {"layers 0", set("/cache/layers", 0), ErrorId::kSize, "cache.layers"},
      {"head_dim beyond int32", set("/cache/head_dim", std::int64_t{1} << 31), ErrorId::kSize, "cache.head_dim"},
      {"states beyond int64", set("/cache/states", std::uint64_t{1} << 63), ErrorId::kSize, "cache.states"},
      {"window as 1e30", set("/cache/window", 1e30), ErrorId::kSize, "cache.window"},
      {"pool bytes overflow",
       [big](json& j) {
         at(j, "/cache/states") = big;
         at(j, "/cache/ring_rows") = big;
       },
       ErrorId::kSize, "cache"},
      {"pool bytes overflow via heads",
       [](json& j) {
         at(j, "/cache/head_dim") = 1 << 30;
         at(j, "/cache/ring_rows") = std::int64_t{1} << 30;
       },
       ErrorId::kSize, "cache"},
      {"prefill rows 0", set("/steps/0/rows", 0), ErrorId::kSize, "steps[0].rows"},
      {"prefill rows negative", set("/steps/0/rows", -1), ErrorId::kSize, "steps[0].rows"},
      {"prefill rows beyond 2^20", set("/steps/0/rows", (1 << 20) + 1), ErrorId::kSize, "steps[0].rows"},
      {"drafts negative", set("/steps/2/drafts", -1), ErrorId::kSize, "steps[2].drafts"},
      // relations
      {"q_heads not a multiple of kv_heads",
       [](json& j) {
         at(j, "/cache/q_heads") = 3;
         at(j, "/cache/kv_heads") = 2;
       },
       ErrorId::kJsonValue, "cache.q_heads"},
      {"shared row with 2 kv heads",
       [](json& j) {
         at(j, "/cache/shared_row") = true;
         at(j, "/cache/kv_heads") = 2;
       },
       ErrorId::kJsonValue, "cache.shared_row"},
      {"rotary_dims odd", set("/cache/rope", json{{"style", "neox"}, {"rotary_dims", 1}}), ErrorId::kJsonValue, "cache.rope.rotary_dims"},
      {"rotary_dims beyond head_dim", set("/cache/rope", json{{"style", "neox"}, {"rotary_dims", 4}}), ErrorId::kJsonValue, "cache.rope.rotary_dims"},
      {"rotary_dims without a style", set("/cache/rope", json{{"rotary_dims", 2}}), ErrorId::kJsonValue, "cache.rope.rotary_dims"},
      {"rope base 0", set("/cache/rope", json{{"base", 0}}), ErrorId::kJsonValue, "cache.rope.base"},
      {"softmax_scale negative", set("/cache/softmax_scale", -1.0), ErrorId::kJsonValue, "cache.softmax_scale"},
      {"negative request id", set("/requests/0/id", -1), ErrorId::kJsonValue, "requests[0].id"},
      {"duplicate request id", set("/requests/1/id", 0), ErrorId::kJsonValue, "requests[1].id"},
      {"state out of range", set("/requests/1/state", 2), ErrorId::kJsonValue, "requests[1].state"},
      {"step names an unknown request", set("/steps/1/request", 7), ErrorId::kJsonValue, "steps[1].request"},
      {"state held by an active request", set("/requests/1/state", 0), ErrorId::kJsonValue, "steps[1].request"},
      {"accept exceeds drafts", set("/steps/3/accepted", 3), ErrorId::kJsonValue, "steps[3].accepted"},
      {"accept negative", set("/steps/3/accepted", -1), ErrorId::kJsonValue, "steps[3].accepted"},
      {"accept without verify", set("/steps/2", json{{"kind", "decode"}, {"request", 0}}), ErrorId::kJsonValue, "steps[3].kind"},
      {"decode while verify pending",
       [](json& j) { j["steps"].insert(j["steps"].begin() + 3, json{{"kind", "decode"}, {"request", 0}}); },
       ErrorId::kJsonValue, "steps[3].kind"},
      {"step after finish",
       [](json& j) { j["steps"].push_back(json{{"kind", "reset"}, {"request", 0}}); },
       ErrorId::kJsonValue, "steps[5].request"},
      {"row layer out of range", set("/data/rows/0/layer", 1), ErrorId::kJsonValue, "data.rows[0].layer"},
      {"row of an unknown request", set("/data/rows/0/request", 9), ErrorId::kJsonValue, "data.rows[0].request"},
      {"row position negative", set("/data/rows/0/position", -1), ErrorId::kJsonValue, "data.rows[0].position"},
      {"row position never written", set("/data/rows/0/position", 6), ErrorId::kJsonValue, "data.rows[0].position"},
      {"row k too wide", set("/data/rows/0/k", json{1, 2, 3}), ErrorId::kJsonValue, "data.rows[0].k"},
      {"row q too narrow", set("/data/rows/0/q", json{1, 2}), ErrorId::kJsonValue, "data.rows[0].q"},
      {"duplicate row",
       [](json& j) { j["data"]["rows"].push_back(j["data"]["rows"][0]); },
       ErrorId::kJsonValue, "data.rows[1]"},
      // row steps: steps[0] prefill 0..2 and steps[2] verify 3..5 of request 0,
      // steps[1] decode of request 1, steps[3] accept, steps[4] finish
      {"row step as string", set("/data/rows/0/step", "0"), ErrorId::kJsonType, "data.rows[0].step"},
      {"row step fractional", set("/data/rows/0/step", 0.5), ErrorId::kJsonType, "data.rows[0].step"},
      {"row step negative", set("/data/rows/0/step", -1), ErrorId::kJsonValue, "data.rows[0].step"},
      {"row step beyond the steps", set("/data/rows/0/step", 5), ErrorId::kJsonValue, "data.rows[0].step"},
      {"row step an accept", set("/data/rows/0/step", 3), ErrorId::kJsonValue, "data.rows[0].step"},
      {"row step a finish", set("/data/rows/0/step", 4), ErrorId::kJsonValue, "data.rows[0].step"},
      {"row step of another request", set("/data/rows/0/step", 1), ErrorId::kJsonValue, "data.rows[0].step"},
      {"row step writing other positions", set("/data/rows/0/step", 2), ErrorId::kJsonValue, "data.rows[0].step"},
      {"row step at a position another step writes",
       [](json& j) {
         at(j, "/data/rows/0/position") = 5;  // written by the verify, not by the prefill
         at(j, "/data/rows/0/step") = 0;
       },
       ErrorId::kJsonValue, "data.rows[0].step"},
      {"duplicate row for one step",
       [](json& j) {
         at(j, "/data/rows/0/step") = 0;
         j["data"]["rows"].push_back(j["data"]["rows"][0]);
       },
       ErrorId::kJsonValue, "data.rows[1]"},
      {"duplicate row for one step after an unstepped one",
       [](json& j) {
         json stepped = j["data"]["rows"][0];
         stepped["step"] = 0;
         j["data"]["rows"].push_back(stepped);
         j["data"]["rows"].push_back(stepped);
       },
       ErrorId::kJsonValue, "data.rows[2]"},
      {"expectation step out of range", set("/expect/overwritten/0/step", 9), ErrorId::kJsonValue, "expect.overwritten[0].step"},
      {"expectation on an accept step", set("/expect/overwritten/0/step", 3), ErrorId::kJsonValue, "expect.overwritten[0].step"},
      {"expectation counts length", set("/expect/overwritten/0/counts", json{0, 0}), ErrorId::kJsonValue, "expect.overwritten[0].counts"},
      {"expectation count negative", set("/expect/overwritten/0/counts/1", -1), ErrorId::kJsonValue, "expect.overwritten[0].counts[1]"},
      {"expectation count beyond visible", set("/expect/overwritten/0/counts/0", 5), ErrorId::kJsonValue, "expect.overwritten[0].counts[0]"},
      {"duplicate expectation",
       [](json& j) { j["expect"]["overwritten"].push_back(j["expect"]["overwritten"][0]); },
       ErrorId::kJsonValue, "expect.overwritten[1].step"},
      {"collisions negative", set("/expect/collisions", -1), ErrorId::kJsonValue, "expect.collisions"},
      {"tolerance negative", set("/expect/output_tolerance", -1e-6), ErrorId::kJsonValue, "expect.output_tolerance"},
      // absurd reals
      {"row value 1e19", set("/data/rows/0/v/1", 1e19), ErrorId::kNonFinite, "data.rows[0].v[1]"},
      {"sink logit 1e300", set("/cache/sink_logit", 1e300), ErrorId::kNonFinite, "cache.sink_logit"},
  };
  for (const BadCase& c : cases) {
    DYNAMIC_SECTION(c.label) {
      json j = base();
      c.mutate(j);
      const Error e = catch_error([&] { parse_scenario(j.dump(), ""); });
      INFO(e.what());
      CHECK(e.id() == c.id);
      CHECK(e.where() == c.where);
    }
  }
}

TEST_CASE("Scenarios: a shared prefix round-trips and starts its request at the prefix's length") {
  json j = base();
  j["requests"][1]["prefix"] = json{{"request", 0}, {"positions", 3}};
  const Scenario sc = parse_scenario(j.dump(), "prefix");
  REQUIRE(sc.requests[1].prefix);
  CHECK(sc.requests[1].prefix->request == 0);
  CHECK(sc.requests[1].prefix->positions == 3);
  CHECK_FALSE(sc.requests[0].prefix);
  CHECK(parse_scenario(save_scenario(sc), "again") == sc);
  // Request 1's decode writes position 3, not 0: the schedule reaches 4 (the
  // verify of request 0 reaches 3 + 2 + 1 = 6 either way).
  std::vector<kvcheck::scenarios::Step> decode_only = {sc.steps[0], sc.steps[1]};
  CHECK(kvcheck::scenarios::schedule_end(decode_only, sc.requests) == 4);
  CHECK(kvcheck::scenarios::schedule_end(decode_only) == 3);
  // Without a prefix the file carries no prefix key.
  CHECK(save_scenario(parse_scenario(kBase, "plain")).find("prefix") == std::string::npos);
}

TEST_CASE("Scenarios: a request writing 2^40 rows over its schedule is a size error") {
  // Built in code: the JSON text would be tens of megabytes.
  Scenario s = parse_scenario(kBase, "");
  s.expect.reset();
  s.data.rows.clear();
  Step step;
  step.kind = StepKind::kPrefill;
  step.rows = kMaxPrefillRows;
  s.steps.assign(static_cast<std::size_t>(kMaxRows / kMaxPrefillRows) + 1, step);
  const Error e = catch_error([&] { validate_scenario(s); });
  CHECK(e.id() == ErrorId::kSize);
  CHECK(e.where() == "steps[" + std::to_string(kMaxRows / kMaxPrefillRows - 1) + "]");
}

TEST_CASE("Scenarios: malformed text fails with syntax or non-finite errors") {
  struct TextCase {
    const char* label;
    std::string text;
    ErrorId id;
    std::string where;
  };
  const std::string b = kBase;
  const auto replace = [&b](const std::string& from, const std::string& to) {
    std::string t = b;
    const auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    return t;
  };
  const std::vector<TextCase> cases = {
      {"empty input", "", ErrorId::kJsonSyntax, "byte 1"},
      {"root array", "[]", ErrorId::kJsonType, ""},
      {"trailing garbage", b + "x", ErrorId::kJsonSyntax, ""},
      {"NaN literal", replace("\"k\": [1, 2]", "\"k\": [NaN, 2]"), ErrorId::kJsonSyntax, ""},
      {"Infinity literal", replace("\"k\": [1, 2]", "\"k\": [1, Infinity]"), ErrorId::kJsonSyntax, ""},
      {"1e999 in a row", replace("\"k\": [1, 2]", "\"k\": [1e999, 2]"), ErrorId::kNonFinite,
       "data.rows[0].k[0]"},
      {"-1e999 tolerance", replace("1e-6", "-1e999"), ErrorId::kNonFinite, "expect.output_tolerance"},
      {"integer beyond uint64", replace("\"seed\": 1", "\"seed\": 184467440737095516160"), ErrorId::kSize,
       "data.seed"},
      {"duplicate key", replace("\"window\": 4", "\"window\": 4, \"window\": 5"), ErrorId::kJsonSyntax,
       "cache.window"},
      {"comment", replace("\"cache\"", "/* c */ \"cache\""), ErrorId::kJsonSyntax, ""},
      {"deep nesting", replace("\"test base\"", std::string(40, '[') + std::string(40, ']')),
       ErrorId::kJsonSyntax, ""},
      {"invalid UTF-8", replace("test base", "\xff\xfe"), ErrorId::kJsonSyntax, ""},
  };
  for (const TextCase& c : cases) {
    DYNAMIC_SECTION(c.label) {
      const Error e = catch_error([&] { parse_scenario(c.text, ""); });
      INFO(e.what());
      CHECK(e.id() == c.id);
      if (c.id == ErrorId::kJsonSyntax && c.where.empty()) {
        CHECK((e.where().rfind("byte ", 0) == 0 || e.where().find('[') != std::string::npos));
      } else {
        CHECK(e.where() == c.where);
      }
    }
  }
}

TEST_CASE("Scenarios: truncated JSON fails with a syntax error at every cut point") {
  std::size_t cuts = 0, syntax_errors = 0;
  for (const char* name : {"verify-s128", "attention-lab-full", "gqa-bf16-interleaved-rope"}) {
    const std::string text = read_text(bundled(name));
    const std::size_t content = text.find_last_not_of(" \n") + 1;
    for (std::size_t cut = 0; cut < content; ++cut) {
      ++cuts;
      try {
        parse_scenario(std::string_view(text).substr(0, cut), "");
        FAIL("prefix of " << cut << " bytes parsed");
      } catch (const Error& e) {
        if (e.id() != ErrorId::kJsonSyntax || e.where().rfind("byte ", 0) != 0) {
          FAIL(name << " cut at " << cut << ": " << e.what());
        }
        ++syntax_errors;
      }
    }
  }
  // Every cut point was tried and each one was a syntax error at a byte.
  CHECK(cuts > 1000);
  CHECK(syntax_errors == cuts);
}

TEST_CASE("Scenarios: defaults fill omitted cache fields and canonical save writes them all") {
  const Scenario s = parse_scenario(R"({"schema_version": 1, "name": "min", "description": "",
      "cache": {"window": 3, "ring_rows": 5}, "requests": [], "steps": []})",
                                    "");
  CHECK(s.cache.states == 1);
  CHECK(s.cache.head_dim == 4);
  CHECK(s.cache.convention == Convention::kKeys);
  CHECK(s.cache.rope.base == 10000.0);
  CHECK_FALSE(s.cache.softmax_scale);
  CHECK_FALSE(s.expect);
  const std::string text = save_scenario(s);
  for (const char* key :
       {"\"window_convention\": \"keys\"", "\"softmax_scale\": null", "\"sink_logit\": null",
        "\"data\": {\"seed\": 0, \"rows\": []}", "\"expect\": null", "\"base\": 10000.0"}) {
    CHECK(text.find(key) != std::string::npos);
  }
  CHECK(parse_scenario(text, "") == s);
}

TEST_CASE("Scenarios: explicit rows for one step round-trip and stand beside unstepped rows") {
  // steps[0] prefill 0..1, steps[1] verify 2..4 (drafts 3, 4 rejected),
  // steps[3] decode rewrites 3, steps[4] reset, steps[5] decode rewrites 0.
  const char* const text = R"({
    "schema_version": 1, "name": "stepped", "description": "",
    "cache": {"window": 4, "ring_rows": 6, "head_dim": 2},
    "data": {"seed": 3, "rows": [
      {"layer": 0, "request": 0, "position": 3, "step": 1, "k": [1, 2], "v": [3, 4], "q": [5, 6]},
      {"layer": 0, "request": 0, "position": 3, "step": 3, "k": [7, 8], "v": [9, 10], "q": [11, 12]},
      {"layer": 0, "request": 0, "position": 3, "k": [0.5, 0.25], "v": [1, 1], "q": [2, 2]},
      {"layer": 0, "request": 0, "position": 0, "step": 5, "k": [-1, -2], "v": [-3, -4], "q": [-5, -6]},
      {"layer": 0, "request": 0, "position": 0, "step": 0, "k": [1, 0], "v": [0, 1], "q": [1, 1]}]},
    "requests": [{"id": 0, "state": 0}],
    "steps": [{"kind": "prefill", "request": 0, "rows": 2, "order": "load_then_store"},
              {"kind": "verify", "request": 0, "drafts": 2},
              {"kind": "accept", "request": 0, "accepted": 0},
              {"kind": "decode", "request": 0},
              {"kind": "reset", "request": 0},
              {"kind": "decode", "request": 0}]
  })";
  const Scenario s = parse_scenario(text, "");
  REQUIRE(s.data.rows.size() == 5);
  CHECK(s.data.rows[0].step == 1);
  CHECK(s.data.rows[1].step == 3);
  CHECK_FALSE(s.data.rows[2].step);
  CHECK(s.data.rows[3].step == 5);
  CHECK(s.data.rows[4].step == 0);
  const std::string saved = save_scenario(s);
  CHECK(saved.find(R"({"layer": 0, "request": 0, "position": 3, "step": 1, "k": [1.0, 2.0], )") !=
        std::string::npos);
  CHECK(saved.find(R"({"layer": 0, "request": 0, "position": 3, "k": [0.5, 0.25], )") != std::string::npos);
  CHECK(parse_scenario(saved, "") == s);
  CHECK(save_scenario(parse_scenario(saved, "")) == saved);

  // Without a step nothing is written for it: the base document keeps its rows' keys.
  const Scenario b = parse_scenario(kBase, "");
  REQUIRE(b.data.rows.size() == 1);
  CHECK_FALSE(b.data.rows[0].step);
  const std::string base_text = save_scenario(b);
  CHECK(
      base_text.find(
          R"({"layer": 0, "request": 0, "position": 1, "k": [1.0, 2.0], "v": [3.0, 4.0], "q": [1.0, 2.0, 3.0, 4.0]})") !=
      std::string::npos);
  CHECK(base_text.find("\"step\": 0") == std::string::npos);

  // A step set in code is validated and saved like a parsed one.
  Scenario coded = b;
  coded.data.rows[0].step = 0;
  CHECK(parse_scenario(save_scenario(coded), "") == coded);
  coded.data.rows[0].step = 2;  // the verify writes 3..5, not position 1
  const Error e = catch_error([&] { save_scenario(coded); });
  CHECK(e.id() == ErrorId::kJsonValue);
  CHECK(e.where() == "data.rows[0].step");
  CHECK(std::string(e.what()).find("steps[2] writes positions 3..5, not position 1") != std::string::npos);
}

TEST_CASE("Scenarios: validate_scenario rejects fields foreign to a step's kind") {
  Scenario s = parse_scenario(kBase, "");
  s.steps[1].rows = 3;  // a decode step
  const Error e = catch_error([&] { save_scenario(s); });
  CHECK(e.id() == ErrorId::kJsonValue);
  CHECK(e.where() == "steps[1].rows");
}

TEST_CASE("Scenarios: atomic write replaces the file or leaves the old one untouched") {
  TempDir dir;
  const fs::path target = dir.path / "s.json";
  const Scenario s = parse_scenario(kBase, "");
  write_scenario_file(target, s);
  CHECK(read_text(target) == save_scenario(s));

  SECTION("an invalid scenario throws before touching the disk") {
    Scenario bad = s;
    bad.cache.window = 0;
    const Error e = catch_error([&] { write_scenario_file(target, bad); });
    CHECK(e.id() == ErrorId::kSize);
    CHECK(read_text(target) == save_scenario(s));
    CHECK(files_in(dir.path) == std::vector<fs::path>{"s.json"});
  }
  SECTION("a rename that fails removes the temporary file") {
    fs::create_directory(dir.path / "d.json");
    write_text(dir.path / "d.json" / "keep", "x");
    const Error e = catch_error([&] { write_scenario_file(dir.path / "d.json", s); });
    CHECK(e.id() == ErrorId::kIo);
    CHECK(files_in(dir.path) == std::vector<fs::path>{"d.json", "s.json"});
    CHECK(read_text(dir.path / "d.json" / "keep") == "x");
  }
  SECTION("a missing directory is an I/O error") {
    const Error e = catch_error([&] { write_scenario_file(dir.path / "no" / "s.json", s); });
    CHECK(e.id() == ErrorId::kIo);
    CHECK(e.where() == (dir.path / "no" / "s.json").string());
  }
  SECTION("an unwritable directory leaves the old file") {
    Scenario other = s;
    other.name = "other";
    if (::geteuid() == 0) {
      // Directory permissions do not stop root: the write goes through, and
      // must then be whole (the new file, no temporary left).
      WARN("running as root: directory permissions do not stop writes; checked the write is whole instead");
      fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
      write_scenario_file(target, other);
      fs::permissions(dir.path, fs::perms::owner_all);
      CHECK(load_scenario_file(target) == other);
      CHECK(files_in(dir.path) == std::vector<fs::path>{"s.json"});
      return;
    }
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
    const Error e = catch_error([&] { write_scenario_file(target, other); });
    fs::permissions(dir.path, fs::perms::owner_all);
    CHECK(e.id() == ErrorId::kIo);
    CHECK(read_text(target) == save_scenario(s));
  }
  SECTION("overwriting replaces the content") {
    Scenario other = s;
    other.name = "other";
    write_scenario_file(target, other);
    CHECK(load_scenario_file(target) == other);
    CHECK(files_in(dir.path) == std::vector<fs::path>{"s.json"});
  }
}

TEST_CASE("Scenarios: load_scenario_file reports I/O errors and names the file") {
  TempDir dir;
  const Error missing = catch_error([&] { load_scenario_file(dir.path / "none.json"); });
  CHECK(missing.id() == ErrorId::kIo);
  write_text(dir.path / "bad.json", "{");
  const Error bad = catch_error([&] { load_scenario_file(dir.path / "bad.json"); });
  CHECK(bad.id() == ErrorId::kJsonSyntax);
  CHECK(std::string(bad.what()).find("bad.json") != std::string::npos);
}

TEST_CASE("Scenarios: collect_scenario_files is recursive, sorted and duplicate-free") {
  TempDir dir;
  fs::create_directories(dir.path / "b" / "c");
  fs::create_directories(dir.path / "a");
  for (const char* f : {"b/c/z.json", "b/y.json", "a/x.json", "a/notes.txt", "a/s.schema.json"}) {
    write_text(dir.path / f, "{}");
  }
  const std::string root = dir.path.string();
  const auto files = collect_scenario_files({root + "/b", root, (dir.path / "a" / "notes.txt").string()});
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(fs::relative(f, dir.path).generic_string());
  CHECK(names == std::vector<std::string>{"a/notes.txt", "a/x.json", "b/c/z.json", "b/y.json"});
  const Error e = catch_error([&] { collect_scenario_files({root + "/missing"}); });
  CHECK(e.id() == ErrorId::kIo);
  CHECK(e.where() == root + "/missing");
}

namespace {

/// Any finite double within the accepted magnitude, with the edge values
/// (signed zero, subnormals, exact integers, short decimals) weighted in.
rc::Gen<double> gen_real() {
  return rc::gen::oneOf(
      rc::gen::suchThat(rc::gen::arbitrary<double>(),
                        [](double x) { return std::isfinite(x) && std::fabs(x) <= kMaxMagnitude; }),
      rc::gen::element(0.0, -0.0, 1.0, -1.5, 0.1, 1e-6, 5e-324, 2.2250738585072014e-308, 1e18, -1e18,
                       123456789.0, 0.30000000000000004),
      rc::gen::map(rc::gen::inRange(-1000, 1000), [](int i) { return i / 8.0; }));
}

std::string gen_text(bool allow_control) {
  // Printable ASCII including quotes and backslashes, some multi-byte UTF-8.
  static const std::vector<std::string> pieces = {"a", "Z", "0", "-", " ", "\"", "\\",
                                                  "/", "§", "é", "→", "𝛼", "{",  "]"};
  const auto n = *rc::gen::inRange(allow_control ? 0 : 1, 12);
  std::string out;
  for (int i = 0; i < n; ++i) {
    if (allow_control && *rc::gen::inRange(0, 8) == 0) {
      out += static_cast<char>(*rc::gen::inRange(1, 32));
    } else {
      out += *rc::gen::elementOf(pieces);
    }
  }
  return out;
}

/// A random valid scenario, built so that every validation rule holds.
Scenario gen_scenario() {
  Scenario s;
  s.name = gen_text(false);
  s.description = gen_text(true);
  CacheConfig& c = s.cache;
  c.window = *rc::gen::inRange<std::int64_t>(1, 300);
  c.convention = *rc::gen::element(Convention::kKeys, Convention::kLeft, Convention::kOffByOne);
  c.ring_rows = *rc::gen::inRange<std::int64_t>(1, 300);
  c.states = *rc::gen::inRange<std::int64_t>(1, 5);
  c.kv_heads = *rc::gen::inRange(1, 4);
  c.q_heads = c.kv_heads * *rc::gen::inRange(1, 4);
  c.head_dim = *rc::gen::inRange(1, 9);
  c.shared_row = c.kv_heads == 1 && *rc::gen::arbitrary<bool>();
  c.format = *rc::gen::elementOf(
      std::vector<Format>(std::begin(kvcheck::kElementFormats), std::end(kvcheck::kElementFormats)));
  c.rope.style = c.head_dim >= 2
                     ? *rc::gen::element(RopeStyle::kNone, RopeStyle::kNeox, RopeStyle::kInterleaved)
                     : RopeStyle::kNone;
  c.rope.rotary_dims = c.rope.style == RopeStyle::kNone ? 0 : 2 * *rc::gen::inRange(1, c.head_dim / 2 + 1);
  c.rope.base = *rc::gen::suchThat(gen_real(), [](double x) { return x > 0; });
  c.layers = *rc::gen::inRange(1, 4);
  if (*rc::gen::arbitrary<bool>())
    c.softmax_scale = *rc::gen::suchThat(gen_real(), [](double x) { return x > 0; });
  if (*rc::gen::arbitrary<bool>()) c.sink_logit = *gen_real();
  s.data.seed = *rc::gen::arbitrary<std::uint64_t>();

  // Requests on random states; the schedule only starts one whose state is free.
  const int n_requests = *rc::gen::inRange(0, 5);
  for (int i = 0; i < n_requests; ++i) {
    s.requests.push_back(
        {*rc::gen::inRange<std::int64_t>(0, 1000) * 8 + i, *rc::gen::inRange<std::int64_t>(0, c.states)});
  }
  struct Live {
    int phase = 0;  // 0 idle, 1 active, 2 finished
    std::int64_t length = 0, written_end = 0;
    std::optional<std::int64_t> verify_drafts;
  };
  std::vector<Live> live(s.requests.size());
  std::vector<std::int64_t> first_position;
  const int n_steps = n_requests == 0 ? 0 : *rc::gen::inRange(0, 25);
  for (int i = 0; i < n_steps; ++i) {
    const auto r = static_cast<std::size_t>(*rc::gen::inRange(0, n_requests));
    Live& l = live[r];
    if (l.phase == 2) continue;
    if (l.phase == 0) {
      bool busy = false;
      for (std::size_t o = 0; o < live.size(); ++o) {
        busy = busy || (live[o].phase == 1 && s.requests[o].state == s.requests[r].state);
      }
      if (busy) continue;
      l.phase = 1;
    }
    Step step;
    step.request = s.requests[r].id;
    if (l.verify_drafts) {
      const int pick = *rc::gen::inRange(0, 6);
      step.kind = pick == 0 ? StepKind::kFinish : pick == 1 ? StepKind::kReset : StepKind::kAccept;
    } else {
      step.kind = *rc::gen::element(StepKind::kPrefill, StepKind::kDecode, StepKind::kVerify,
                                    StepKind::kFinish, StepKind::kReset, StepKind::kTrim, StepKind::kPreempt);
      if (step.kind == StepKind::kTrim && l.length == 0) step.kind = StepKind::kDecode;
    }
    first_position.push_back(l.length);
    switch (step.kind) {
      case StepKind::kPrefill:
        step.rows = *rc::gen::inRange<std::int64_t>(1, 20);
        step.order = *rc::gen::element(Order::kLoadThenStore, Order::kStoreThenLoad);
        l.length += step.rows;
        break;
      case StepKind::kDecode: l.length += 1; break;
      case StepKind::kVerify:
        step.drafts = *rc::gen::inRange<std::int64_t>(0, 6);
        l.verify_drafts = step.drafts;
        break;
      case StepKind::kAccept:
        step.accepted = *rc::gen::inRange<std::int64_t>(0, *l.verify_drafts + 1);
        l.length += 1 + step.accepted;
        l.verify_drafts.reset();
        break;
      case StepKind::kFinish:
        l.phase = 2;
        l.verify_drafts.reset();
        break;
      case StepKind::kReset:
        l.length = 0;
        l.verify_drafts.reset();
        break;
      case StepKind::kTrim:
        step.positions = *rc::gen::inRange<std::int64_t>(1, l.length + 1);
        l.length -= step.positions;
        break;
      case StepKind::kPreempt: l.verify_drafts.reset(); break;  // L unchanged
    }
    l.written_end = std::max(l.written_end, first_position.back() + step_rows(step));
    s.steps.push_back(step);
  }

  // Explicit rows at written positions, without duplicates, for any step.
  for (std::size_t r = 0; r < live.size(); ++r) {
    for (std::int64_t p = 0; p < live[r].written_end; ++p) {
      if (*rc::gen::inRange(0, 10) != 0) continue;
      ExplicitRow row;
      row.layer = *rc::gen::inRange(0, c.layers);
      row.request = s.requests[r].id;
      row.position = p;
      const auto kv = static_cast<std::size_t>(c.kv_heads * c.head_dim);
      row.k = *rc::gen::container<std::vector<double>>(kv, gen_real());
      if (!c.shared_row) row.v = *rc::gen::container<std::vector<double>>(kv, gen_real());
      row.q = *rc::gen::container<std::vector<double>>(static_cast<std::size_t>(c.q_heads * c.head_dim),
                                                       gen_real());
      s.data.rows.push_back(std::move(row));
    }
  }

  // Rows for one writing step at positions it writes (one per step and position).
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    for (std::int64_t q = 0; q < step_rows(s.steps[i]); ++q) {
      if (*rc::gen::inRange(0, 10) != 0) continue;
      ExplicitRow row;
      row.layer = *rc::gen::inRange(0, c.layers);
      row.request = s.steps[i].request;
      row.position = first_position[i] + q;
      row.step = static_cast<std::int64_t>(i);
      const auto kv = static_cast<std::size_t>(c.kv_heads * c.head_dim);
      row.k = *rc::gen::container<std::vector<double>>(kv, gen_real());
      if (!c.shared_row) row.v = *rc::gen::container<std::vector<double>>(kv, gen_real());
      row.q = *rc::gen::container<std::vector<double>>(static_cast<std::size_t>(c.q_heads * c.head_dim),
                                                       gen_real());
      s.data.rows.push_back(std::move(row));
    }
  }

  if (*rc::gen::arbitrary<bool>()) {
    Expectations e;
    const std::int64_t keys = c.convention == Convention::kKeys ? c.window : c.window + 1;
    for (std::size_t i = 0; i < s.steps.size(); ++i) {
      if (step_rows(s.steps[i]) == 0 || *rc::gen::inRange(0, 2) == 0) continue;
      OverwriteExpectation o;
      o.step = static_cast<std::int64_t>(i);
      for (std::int64_t q = 0; q < step_rows(s.steps[i]); ++q) {
        o.counts.push_back(*rc::gen::inRange<std::int64_t>(0, std::min(first_position[i] + q + 1, keys) + 1));
      }
      e.overwritten.push_back(std::move(o));
    }
    if (*rc::gen::arbitrary<bool>()) e.collisions = *rc::gen::inRange<std::int64_t>(0, 1000);
    if (*rc::gen::arbitrary<bool>()) {
      e.output_tolerance = *rc::gen::suchThat(gen_real(), [](double x) { return x >= 0; });
    }
    s.expect = e;
  }
  return s;
}

}  // namespace

TEST_CASE("Scenarios: random valid scenarios round-trip save, parse, save") {
  rc::prop("parse(save(s)) == s and save is byte-stable", [] {
    const Scenario s = gen_scenario();
    const std::string text = save_scenario(s);
    const Scenario back = parse_scenario(text, "");
    RC_ASSERT(back == s);
    RC_ASSERT(save_scenario(back) == text);
  });
  rc::prop("every prefix and byte flip of a saved scenario parses or throws kvcheck::Error", [] {
    const std::string text = save_scenario(gen_scenario());
    const auto cut = *rc::gen::inRange<std::size_t>(0, text.size() + 1);
    std::string mutated = text.substr(0, cut);
    if (!mutated.empty() && *rc::gen::arbitrary<bool>()) {
      mutated[*rc::gen::inRange<std::size_t>(0, mutated.size())] = *rc::gen::arbitrary<char>();
    }
    try {
      parse_scenario(mutated, "");
    } catch (const kvcheck::Error&) {
    }
  });
}

TEST_CASE("Scenarios: layer windows read with the cache's defaults, round-trip and give each layer its keys") {
  json doc = base();
  doc["cache"]["layers"] = 3;
  doc["cache"]["window_convention"] = "left";
  doc["cache"]["layer_windows"] = json::array(
      {json::object(), json{{"window", nullptr}}, json{{"window", 2}, {"convention", "keys"}}});
  const Scenario s = parse_scenario(doc.dump(), "layers");
  REQUIRE(s.cache.layer_windows.size() == 3);
  // An entry without a window or convention takes the cache's (left 4: 5 keys).
  CHECK(s.cache.layer_windows[0] == LayerWindow{4, Convention::kLeft});
  CHECK(layer_window_keys(s.cache, 0) == 5);
  CHECK_FALSE(s.cache.layer_windows[1].window.has_value());
  CHECK(layer_window_keys(s.cache, 1) == kGlobalWindowKeys);
  CHECK(layer_window_keys(s.cache, 2) == 2);
  CHECK(has_global_layer(s.cache));
  CHECK(widest_sliding_window_keys(s.cache) == 5);
  // Canonical text names every entry in full, and reads back the same.
  const std::string text = save_scenario(s);
  CHECK(text.find("\"layer_windows\": [\n      {\"window\": 4, \"convention\": \"left\"},\n      {\"window\": "
                  "null},\n      {\"window\": 2, \"convention\": \"keys\"}\n    ]") != std::string::npos);
  CHECK(parse_scenario(text, "") == s);
  // Without the key every layer has the cache's window, and the text has no layer_windows.
  const Scenario plain = parse_scenario(kBase, "base");
  CHECK(plain.cache.layer_windows.empty());
  CHECK(layer_window_keys(plain.cache, 0) == 4);
  CHECK(save_scenario(plain).find("layer_windows") == std::string::npos);
}

TEST_CASE("Traces: a header's layer windows round-trip, and keys that disagree name the entry") {
  TraceHeader h;
  h.name = "layers";
  h.window = 3;
  h.capacity = 9;
  h.addressing = Addressing::kRing;
  h.layer_windows = {LayerWindow{3, Convention::kLeft}, LayerWindow{std::nullopt, Convention::kKeys}};
  const std::string line = trace_header_line(h);
  CHECK(line.find(R"("layer_windows":[{"param":3,"convention":"left","keys":4},{"param":null,"convention":null,"keys":null}])") !=
        std::string::npos);
  const auto runs = parse_trace(line + "\n", "t");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].header == h);
  CHECK(trace_layer_window_keys(h, 0) == 4);
  CHECK(trace_layer_window_keys(h, 1) == kGlobalWindowKeys);
  // Without layer windows the header line has none.
  TraceHeader plain = h;
  plain.layer_windows.clear();
  CHECK(trace_header_line(plain).find("layer_windows") == std::string::npos);
  std::string bad = line;
  bad.replace(bad.find(R"("keys":4)"), 8, R"("keys":3)");
  const Error e = catch_error([&] { (void)parse_trace(bad + "\n", "t"); });
  CHECK(e.where().find("layer_windows[0].keys") != std::string::npos);
}

TEST_CASE("Traces: a paged header's block size and pool round-trip, and only with paged addressing") {
  TraceHeader h;
  h.name = "paged";
  h.window = 4;
  h.addressing = Addressing::kPaged;
  h.block_size = 16;
  h.pool_blocks = 12;
  const std::string line = trace_header_line(h);
  CHECK(line.find(R"("addressing":"paged","block_size":16,"pool_blocks":12)") != std::string::npos);
  const auto runs = parse_trace(line + "\n", "t");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].header == h);
  // Without a block size the header line has neither key (other traces keep their bytes).
  TraceHeader plain = h;
  plain.block_size = 0;
  plain.pool_blocks.reset();
  CHECK(trace_header_line(plain).find("block_") == std::string::npos);
  const std::pair<std::string, std::string> twists[] = {
      {R"("addressing":"opaque","block_size":16)", "block_size"},
      {R"("addressing":"paged","block_size":0)", "block_size"},
      {R"("addressing":"paged","pool_blocks":3)", "pool_blocks"},
  };
  for (const auto& [header, where] : twists) {
    INFO(header);
    const std::string bad = R"({"kvcheck_trace":1,"name":"p","window":{"param":4,"convention":"keys"},)" + header + "}\n";
    const Error e = catch_error([&] { (void)parse_trace(bad, "t"); });
    CHECK(e.where().find(where) != std::string::npos);
  }
}

TEST_CASE("Scenarios: a paged pool (cache.pool_blocks) round-trips, and files without it keep their text") {
  json doc = base();
  doc["cache"]["pool_blocks"] = 5;
  const Scenario s = parse_scenario(doc.dump(), "pool");
  REQUIRE(s.cache.pool_blocks == 5);
  const std::string text = save_scenario(s);
  CHECK(text.find("\"pool_blocks\": 5") != std::string::npos);
  CHECK(parse_scenario(text, "") == s);
  const Scenario plain = parse_scenario(kBase, "base");
  CHECK_FALSE(plain.cache.pool_blocks.has_value());
  CHECK(save_scenario(plain).find("pool_blocks") == std::string::npos);
}
