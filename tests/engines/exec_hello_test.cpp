// The exec handshake read strictly (engines/exec_hello.hpp) and the shape
// space of Capabilities (SizeSet, supports): every misspelled key or name and
// every out-of-range integer is an error naming its JSON path.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "engines/exec_hello.hpp"
#include "support/error.hpp"

namespace {

using Json = nlohmann::json;
using kvcheck::Error;
using kvcheck::engines::Capabilities;
using kvcheck::engines::parse_hello_answer;
using kvcheck::engines::SizeSet;

/// The bundled ring adapter's hello answer (adapters/window_cache.py).
Json ring_hello() {
  return Json::parse(R"({"ok":true,"protocol":"kvcheck-exec","version":1,"name":"ring-cache",
    "capabilities":{"steps":["prefill_load_then_store","prefill_store_then_load","decode","verify","accept",
                             "finish","reset","trim"],
      "formats":["f64","f32","bf16"],"rope":["none","neox","interleaved"],"layouts":["mha","gqa","mqa","shared"],
      "sink":true,"softmax_scale":true,"max_states":0,"max_layers":0,"max_step_rows":0,"max_head_dim":0,
      "reports":{"written_slots":true,"read_slots":true},"addressing":"ring",
      "probes":["accept-without-verify","accept-too-many","begin-busy-state"]}})");
}

/// A paged cache's hello: blocks of 4 rows, frees answered, a bound of
/// blocks per request.
Json paged_hello() {
  Json h = ring_hello();
  h["capabilities"]["addressing"] = "paged";
  h["capabilities"]["block_size"] = 4;
  h["capabilities"]["reports"]["frees"] = true;
  h["capabilities"]["resident_bound"] = {{"unit", "blocks"}, {"per", "request"}};
  return h;
}

/// The error a hello answer gives: "WHERE: RULE", or "" when it parses.
std::string error_of(const Json& answer) {
  try {
    parse_hello_answer(answer, "cmd");
  } catch (const Error& e) {
    CHECK(e.id() == kvcheck::ErrorId::kAdapter);
    return e.where() + ": " + e.rule();
  }
  return "";
}

}  // namespace

TEST_CASE("ExecHello: the bundled adapter's hello reads to what it says") {
  const Capabilities c = parse_hello_answer(ring_hello(), "cmd");
  CHECK(c.name == "exec:ring-cache");
  CHECK(c.verify);
  CHECK(c.decode);
  CHECK(c.formats.size() == 3);
  CHECK(c.gqa);
  CHECK(c.shared_row);
  CHECK(c.sink);
  CHECK(c.ring_addressing);
  CHECK(c.head_dims.unrestricted());
  CHECK(c.computes_outputs);
  CHECK(c.accumulation == kvcheck::engines::Accumulation::kByFormat);
  CHECK(c.probes.size() == 3);
  Json unnamed = ring_hello();
  unnamed.erase("name");
  CHECK(parse_hello_answer(unnamed, "python3 x.py").name == "exec:python3 x.py");
}

TEST_CASE("ExecHello: preempt is declared in steps (docs/semantics.md Preemption), off unless listed") {
  CHECK_FALSE(parse_hello_answer(ring_hello(), "cmd").preempt);
  Json with = ring_hello();
  with["capabilities"]["steps"].push_back("preempt");
  CHECK(parse_hello_answer(with, "cmd").preempt);
  with["capabilities"]["steps"].push_back("preempt");
  CHECK(error_of(with) == "hello answer.capabilities.steps[9]: \"preempt\" listed twice");
}

TEST_CASE(
    "ExecHello: an unknown step, format, layout, RoPE style, addressing or probe is an error naming it") {
  struct Twist {
    const char* key;
    Json value;
    const char* expected;
  };
  const Twist twists[] = {
      {"steps", Json::array({"prefill", "decode"}),
       "hello answer.capabilities.steps[0]: unknown name \"prefill\""},
      {"formats", Json::array({"float32"}), "hello answer.capabilities.formats[0]: unknown name \"float32\""},
      {"formats", Json::array({"f32", "f32"}), "hello answer.capabilities.formats[1]: \"f32\" listed twice"},
      {"formats", Json::array(), "hello answer.capabilities.formats: empty"},
      {"layouts", Json::array({"MHA"}), "hello answer.capabilities.layouts[0]: unknown name \"MHA\""},
      {"rope", Json::array({"yarn"}), "hello answer.capabilities.rope[0]: unknown name \"yarn\""},
      {"addressing", "paged2", "hello answer.capabilities.addressing: unknown value \"paged2\""},
      {"probes", Json::array({"accept-twice"}), "hello answer.capabilities.probes[0]: unknown name"},
      {"accumulation", "f16", "hello answer.capabilities.accumulation: unknown value \"f16\""},
      {"output_format", "bfloat16",
       "hello answer.capabilities.output_format: unknown value \"bfloat16\" (one of \"f64\", \"f32\", "
       "\"bf16\", "
       "\"fp16\")"},
      {"output_format", "accumulation",
       "hello answer.capabilities.output_format: unknown value \"accumulation\""},
      {"output_format", 16, "hello answer.capabilities.output_format: expected a string"},
      {"max_head_dims", 64, "hello answer.capabilities.max_head_dims: unknown key \"max_head_dims\""},
      {"steps", Json::array({"decode", "verify"}), "hello answer.capabilities.steps: verify and accept"},
      {"steps", Json::array({"finish", "reset"}),
       "hello answer.capabilities.steps: no step that writes rows"},
      {"sink", 1, "hello answer.capabilities.sink: expected true or false"},
  };
  for (const Twist& t : twists) {
    Json h = ring_hello();
    h["capabilities"][t.key] = t.value;
    INFO(t.key << " = " << t.value.dump());
    CHECK(error_of(h).rfind(t.expected, 0) == 0);
  }
  Json reports = ring_hello();
  reports["capabilities"]["reports"]["read_slot"] = true;
  CHECK(error_of(reports).rfind("hello answer.capabilities.reports.read_slot: unknown key", 0) == 0);
}

TEST_CASE("ExecHello: the protocol's name and version, and the answer's own keys, are checked") {
  Json h = ring_hello();
  h["protocol"] = "not-kvcheck";
  CHECK(error_of(h).rfind("hello answer.protocol: protocol \"not-kvcheck\"", 0) == 0);
  h = ring_hello();
  h.erase("protocol");
  CHECK(error_of(h) == "hello answer.protocol: missing field");
  h = ring_hello();
  h["version"] = 2;
  CHECK(error_of(h) == "hello answer.version: protocol version 2, kvcheck speaks 1");
  h = ring_hello();
  h["capabilites"] = Json::object();
  CHECK(error_of(h).rfind("hello answer.capabilites: unknown key", 0) == 0);
  h = ring_hello();
  h["name"] = "";
  CHECK(error_of(h) == "hello answer.name: empty");
}

TEST_CASE("ExecHello: an integer out of range is an error naming the field, never a wrapped value") {
  Json h = ring_hello();
  h["capabilities"]["max_states"] = std::uint64_t{18446744073709551615ull};
  CHECK(error_of(h).rfind("hello answer.capabilities.max_states: out of range: 18446744073709551615", 0) ==
        0);
  h = ring_hello();
  h["capabilities"]["max_states"] = std::uint64_t{9223372036854775808ull};
  CHECK(error_of(h).rfind("hello answer.capabilities.max_states: out of range", 0) == 0);
  h = ring_hello();
  h["capabilities"]["max_states"] = std::int64_t{9223372036854775807};
  CHECK(parse_hello_answer(h, "cmd").max_states == 9223372036854775807);
  for (const char* key : {"max_heads", "max_kv_heads", "max_step_rows", "max_positions", "max_window_keys"}) {
    h = ring_hello();
    h["capabilities"][key] = -1;
    INFO(key);
    CHECK(error_of(h).rfind(std::string("hello answer.capabilities.") + key + ": out of range: -1", 0) == 0);
  }
  h = ring_hello();
  h["capabilities"]["max_head_dim"] = 4294967296;
  CHECK(error_of(h).rfind("hello answer.capabilities.max_head_dim: out of range", 0) == 0);
  h = ring_hello();
  h["capabilities"]["max_layers"] = 2.0;
  CHECK(error_of(h) == "hello answer.capabilities.max_layers: expected an integer");
}

TEST_CASE("ExecHello: head_dim and rotary widths as lists or rules, and how the engine computes") {
  Json h = ring_hello();
  h["capabilities"].erase("max_head_dim");
  h["capabilities"]["head_dim"] = {{"multiple_of", 8}, {"max", 256}};
  h["capabilities"]["rotary_dims"] = Json::array({64, 32});
  h["capabilities"]["accumulation"] = "f32";
  h["capabilities"]["probabilities_rounded_to"] = "bf16";
  const Capabilities c = parse_hello_answer(h, "cmd");
  CHECK(c.head_dims.contains(8));
  CHECK(c.head_dims.contains(256));
  CHECK_FALSE(c.head_dims.contains(12));
  CHECK_FALSE(c.head_dims.contains(264));
  CHECK(c.rotary_dims.values == std::vector<std::int64_t>{32, 64});
  CHECK(c.accumulation == kvcheck::engines::Accumulation::kF32);
  CHECK(c.accumulation_epsilon(kvcheck::scenarios::Format::kF64) == 0x1.0p-24);
  CHECK(c.probability_epsilon() == 0x1.0p-8);

  Json both = h;
  both["capabilities"]["max_head_dim"] = 128;
  CHECK(error_of(both).rfind("hello answer.capabilities.max_head_dim: give head_dim or max_head_dim", 0) ==
        0);
  Json empty = h;
  empty["capabilities"]["head_dim"] = {{"multiple_of", 8}, {"min", 9}, {"max", 15}};
  CHECK(error_of(empty) == "hello answer.capabilities.head_dim: no size satisfies these rules");
  Json typo = h;
  typo["capabilities"]["head_dim"] = {{"multiple", 8}};
  CHECK(error_of(typo).rfind("hello answer.capabilities.head_dim.multiple: unknown key", 0) == 0);
  Json zero = h;
  zero["capabilities"]["head_dim"] = Json::array({64, 0});
  CHECK(error_of(zero).rfind("hello answer.capabilities.head_dim[1]: out of range", 0) == 0);
}

TEST_CASE(
    "ExecHello: output_format declares the format outputs are written in, apart from the accumulation") {
  const Json plain = ring_hello();
  CHECK(parse_hello_answer(plain, "cmd").output_format == kvcheck::OutputFormat::kAccumulation);
  const std::pair<const char*, kvcheck::OutputFormat> formats[] = {{"bf16", kvcheck::OutputFormat::kBf16},
                                                                   {"fp16", kvcheck::OutputFormat::kFp16},
                                                                   {"f32", kvcheck::OutputFormat::kF32},
                                                                   {"f64", kvcheck::OutputFormat::kF64}};
  for (const auto& [name, format] : formats) {
    Json h = ring_hello();
    h["capabilities"]["accumulation"] = "f32";
    h["capabilities"]["output_format"] = name;
    const Capabilities c = parse_hello_answer(h, "cmd");
    INFO(name);
    CHECK(c.output_format == format);
    CHECK(c.accumulation == kvcheck::engines::Accumulation::kF32);  // the accumulation is its own declaration
  }
  CHECK(kvcheck::output_format_unit_roundoff(kvcheck::OutputFormat::kBf16) == 0x1.0p-8);
  CHECK(kvcheck::output_format_unit_roundoff(kvcheck::OutputFormat::kFp16) == 0x1.0p-11);
  CHECK(kvcheck::output_format_unit_roundoff(kvcheck::OutputFormat::kAccumulation) == 0);
}

TEST_CASE("ExecHello: a bookkeeping-only engine reports both slots and declares no arithmetic") {
  Json h = ring_hello();
  h["capabilities"]["outputs"] = false;
  const Capabilities c = parse_hello_answer(h, "cmd");
  CHECK_FALSE(c.computes_outputs);
  CHECK(c.accumulation == kvcheck::engines::Accumulation::kF64);  // kvcheck computes them in binary64
  h["capabilities"]["reports"]["read_slots"] = false;
  CHECK(error_of(h).rfind("hello answer.capabilities.outputs: an engine that computes no outputs must report",
                          0) == 0);
  h = ring_hello();
  h["capabilities"]["outputs"] = false;
  h["capabilities"]["accumulation"] = "f32";
  CHECK(error_of(h).rfind("hello answer.capabilities.outputs: an engine that computes no outputs has no",
                          0) == 0);
  h = ring_hello();
  h["capabilities"]["outputs"] = false;
  h["capabilities"]["output_format"] = "bf16";
  CHECK(error_of(h).rfind("hello answer.capabilities.outputs: an engine that computes no outputs has no",
                          0) == 0);
}

TEST_CASE("SizeSet: members, nearest fits along halving and doubling, and descriptions") {
  SizeSet any;
  CHECK(any.unrestricted());
  CHECK(any.contains(3));
  CHECK(any.describe() == "any");
  SizeSet m8;
  m8.multiple_of = 8;
  CHECK(m8.fit(2, 256) == 8);
  CHECK(m8.fit(4, 256) == 8);
  CHECK(m8.fit(8, 256) == 8);
  CHECK(m8.fit(12, 256) == 24);  // doubling first keeps a drawn power of two one
  CHECK(m8.fit(7, 7) == std::nullopt);
  CHECK(m8.largest_at_most(23) == 16);
  CHECK(m8.smallest_at_least(17) == 24);
  CHECK(m8.describe() == "multiples of 8");
  SizeSet max3;
  max3.max = 3;
  CHECK(max3.fit(8, 256) == 2);  // as the generator always halved for max_head_dim
  SizeSet list;
  list.values = {64, 128};
  CHECK(list.fit(2, 256) == 64);
  CHECK(list.fit(256, 256) == 128);
  CHECK(list.fit(96, 256) == 64);
  CHECK(list.fit(2, 32) == std::nullopt);
  CHECK(list.describe() == "one of 64, 128");
}

TEST_CASE("Capabilities: a declared shape space refuses what lies outside it, naming the field") {
  Capabilities c;
  c.head_dims.multiple_of = 8;
  c.rotary_dims.values = {8};
  c.max_kv_heads = 2;
  c.max_window_keys = 5;
  kvcheck::scenarios::CacheConfig cfg;
  cfg.head_dim = 8;
  cfg.window = 5;
  cfg.ring_rows = 8;
  std::string why;
  CHECK(c.supports(cfg, 1, &why));
  cfg.head_dim = 12;
  CHECK_FALSE(c.supports(cfg, 1, &why));
  CHECK(why == "head_dim 12 (it runs multiples of 8)");
  cfg.head_dim = 16;
  cfg.rope.style = kvcheck::scenarios::RopeStyle::kNeox;
  cfg.rope.rotary_dims = 16;
  CHECK_FALSE(c.supports(cfg, 1, &why));
  CHECK(why == "rotary_dims 16 (it runs one of 8)");
  cfg.rope.rotary_dims = 8;
  cfg.q_heads = cfg.kv_heads = 4;
  CHECK_FALSE(c.supports(cfg, 1, &why));
  CHECK(why == "4 KV heads (most 2)");
  cfg.q_heads = cfg.kv_heads = 2;
  cfg.convention = kvcheck::scenarios::Convention::kLeft;  // 6 keys
  CHECK_FALSE(c.supports(cfg, 1, &why));
  CHECK(why == "a window of 6 keys (most 5)");
}

TEST_CASE("Capabilities: each hello step name sets exactly its row of the step-capability table") {
  namespace sc = kvcheck::scenarios;
  Json all = ring_hello()["capabilities"]["steps"];
  all.push_back("preempt");  // declared by no bundled ring (docs/semantics.md "Preemption")
  // The hello's names are the table's: the capability rows, and accept (which runs with verify).
  std::vector<std::string> names;
  for (int i = 0; i < sc::kStepCapabilityCount; ++i)
    names.emplace_back(sc::step_capability_info(static_cast<sc::StepCapability>(i)).name);
  names.emplace_back(sc::step_kind_name(sc::StepKind::kAccept));
  REQUIRE(all.size() == names.size());
  for (const auto& n : names) CHECK(std::find(all.begin(), all.end(), n) != all.end());

  for (int dropped = 0; dropped < sc::kStepCapabilityCount; ++dropped) {
    const auto row = static_cast<sc::StepCapability>(dropped);
    const auto& info = sc::step_capability_info(row);
    Json hello = ring_hello();
    Json steps = Json::array();
    for (const auto& n : all) {
      const bool gone = n == std::string(info.name) ||
                        (info.kind == sc::StepKind::kVerify && n == std::string(sc::step_kind_name(sc::StepKind::kAccept)));
      if (!gone) steps.push_back(n);
    }
    hello["capabilities"]["steps"] = steps;
    INFO(info.name);
    const Capabilities c = parse_hello_answer(hello, "cmd");
    for (int i = 0; i < sc::kStepCapabilityCount; ++i) {
      CHECK(c.runs(static_cast<sc::StepCapability>(i)) == (i != dropped));
    }
    // supports_step asks that row for a step of its kind (accept: verify's row).
    for (const sc::StepKind kind : sc::kStepKinds) {
      for (const sc::Order order : {sc::Order::kLoadThenStore, sc::Order::kStoreThenLoad}) {
        sc::Step s;
        s.kind = kind;
        s.order = order;
        CHECK(c.supports_step(s) == !sc::step_capability_runs(row, kind, order));
      }
    }
  }
}

TEST_CASE("ExecHello: frees and the resident bound, and the limit kvcheck derives for a case") {
  namespace en = kvcheck::engines;
  Json h = ring_hello();
  h["capabilities"]["reports"]["frees"] = true;
  h["capabilities"]["resident_bound"] = {{"unit", "rows"}, {"per", "request"}, {"limit", 12}};
  Capabilities c = parse_hello_answer(h, "cmd");
  CHECK(c.reports_frees);
  CHECK(c.resident_bound.unit == en::ResidentBound::Unit::kRows);
  CHECK(c.resident_bound.per_request);
  en::CacheSpec spec;
  spec.cache.states = 3;
  spec.cache.ring_rows = 10;
  CHECK(en::resident_limit(c, spec) == 12);
  // Without a limit: what kvcheck gives the case.
  c.resident_bound.limit = 0;
  CHECK(en::resident_limit(c, spec) == 10);
  c.resident_bound.per_request = false;
  CHECK(en::resident_limit(c, spec) == 30);
  c.resident_bound.unit = en::ResidentBound::Unit::kBlocks;
  spec.pool_blocks = 9;
  CHECK(en::resident_limit(c, spec) == 9);
  c.resident_bound.per_request = true;
  CHECK(en::resident_limit(c, spec) == 3);
  CHECK(en::resident_limit(parse_hello_answer(ring_hello(), "cmd"), spec) == 0);  // none declared

  const std::pair<Json, std::string> twists[] = {
      {Json{{"unit", "bytes"}}, ".resident_bound.unit: unknown value \"bytes\""},
      {Json{{"unit", "rows"}, {"per", "layer"}}, ".resident_bound.per: unknown value \"layer\""},
      {Json{{"unit", "rows"}, {"limit", 0}}, ".resident_bound.limit: out of range: 0"},
      {Json{{"per", "cache"}}, ".resident_bound.unit: missing"},
      {Json{{"unit", "rows"}, {"limits", 3}}, ".resident_bound.limits: unknown key"},
      {Json{{"unit", "blocks"}}, ".resident_bound.unit: a bound in blocks needs \"addressing\": \"paged\""},
      {Json(4), ".resident_bound: expected an object"},
  };
  for (const auto& [bound, expected] : twists) {
    INFO(expected);
    Json bad = ring_hello();
    bad["capabilities"]["resident_bound"] = bound;
    CHECK_THAT(error_of(bad), Catch::StartsWith("hello answer.capabilities" + expected));
  }
  h = ring_hello();
  h["capabilities"]["reports"]["frees"] = "yes";
  CHECK(error_of(h) == "hello answer.capabilities.reports.frees: expected true or false");
  // Cached rows (docs/semantics.md "Cached rows"): off unless declared.
  CHECK_FALSE(parse_hello_answer(ring_hello(), "cmd").reports_cached);
  h = ring_hello();
  h["capabilities"]["reports"]["cached"] = true;
  CHECK(parse_hello_answer(h, "cmd").reports_cached);
  h["capabilities"]["reports"]["cached"] = 1;
  CHECK(error_of(h) == "hello answer.capabilities.reports.cached: expected true or false");
}

TEST_CASE("ExecHello: paged addressing with a block size, and the pool kvcheck gives a paged case") {
  namespace en = kvcheck::engines;
  Json h = ring_hello();
  h["capabilities"]["addressing"] = "paged";
  CHECK(parse_hello_answer(h, "cmd").block_size == 0);  // "paged" alone: opaque slots, as before block sizes
  h["capabilities"]["block_size"] = 16;
  const Capabilities c = parse_hello_answer(h, "cmd");
  CHECK(c.block_size == 16);
  CHECK_FALSE(c.ring_addressing);
  Json ring = ring_hello();
  ring["capabilities"]["block_size"] = 16;
  CHECK(error_of(ring) ==
        "hello answer.capabilities.block_size: a block size needs \"addressing\": \"paged\" (addressing is "
        "\"ring\")");
  h["capabilities"]["block_size"] = 0;
  CHECK_THAT(error_of(h), Catch::StartsWith("hello answer.capabilities.block_size: out of range: 0"));
  h["capabilities"]["block_size"] = "16";
  CHECK(error_of(h) == "hello answer.capabilities.block_size: expected an integer");
  // states * (ceil(R / B) + 1) with R = max(capacity, keys - 1 + max_step_rows).
  en::CacheSpec spec;
  spec.cache.states = 3;
  spec.cache.ring_rows = 12;
  spec.window_keys = 8;
  spec.max_step_rows = 9;  // a store-then-attend engine holds 8 - 1 + 9 = 16 rows of a request
  CHECK(en::paged_pool_blocks(spec, 4) == 3 * (4 + 1));
  CHECK(en::paged_pool_blocks(spec, 16) == 3 * (1 + 1));
  spec.cache.ring_rows = 17;  // the capacity when it is larger
  CHECK(en::paged_pool_blocks(spec, 4) == 3 * (5 + 1));
  CHECK(en::paged_pool_blocks(spec, 0) == 0);  // not paged
}

TEST_CASE("ExecHello: lookahead slots and a free deferral, and the pool and bounds they widen") {
  namespace en = kvcheck::engines;
  Json h = paged_hello();
  h["capabilities"]["lookahead_slots"] = 5;
  h["capabilities"]["free_deferral_steps"] = 2;
  Capabilities c = parse_hello_answer(h, "cmd");
  CHECK(c.lookahead_slots == 5);
  REQUIRE(c.free_deferral_steps.has_value());
  CHECK(*c.free_deferral_steps == 2);
  CHECK_FALSE(parse_hello_answer(ring_hello(), "cmd").free_deferral_steps.has_value());  // none declared
  CHECK(parse_hello_answer(ring_hello(), "cmd").lookahead_slots == 0);
  // R = max(capacity, keys - 1 + max_step_rows) + lookahead + deferral * max_step_rows:
  // 16 + 5 + 2 * 9 = 39 rows, ceil(39 / 4) + 1 = 11 blocks per state.
  en::CacheSpec spec;
  spec.cache.states = 3;
  spec.cache.ring_rows = 12;
  spec.window_keys = 8;
  spec.max_step_rows = 9;
  CHECK(en::pool_slack_rows(c, spec) == 5 + 2 * 9);
  CHECK(en::paged_pool_blocks(spec, c) == 3 * 11);
  CHECK(en::paged_pool_blocks(spec, 4) == 3 * 5);  // without the slack: ceil(16 / 4) + 1
  CHECK(en::resident_limit(c, spec) == 11);        // the pool over the states
  // A bound in rows: lookahead slots hold no row, a deferral keeps 2 * 9 more.
  c.resident_bound.unit = en::ResidentBound::Unit::kRows;
  CHECK(en::resident_limit(c, spec) == 12 + 18);
  c.resident_bound.per_request = false;
  CHECK(en::resident_limit(c, spec) == 3 * 30);
  c.resident_bound.limit = 7;  // a declared limit is the cache's own count: as declared
  CHECK(en::resident_limit(c, spec) == 7);
  // The sweep's explicit pool wins over every derived size.
  spec.pool_blocks = 4;
  CHECK(en::paged_pool_blocks(spec, c) == 4);

  const std::pair<std::pair<const char*, Json>, std::string> twists[] = {
      {{"lookahead_slots", -1}, ".lookahead_slots: out of range: -1 (0 .. 65536)"},
      {{"lookahead_slots", 65537}, ".lookahead_slots: out of range: 65537 (0 .. 65536)"},
      {{"lookahead_slots", "4"}, ".lookahead_slots: expected an integer"},
      {{"lookahead_slots", 2.5}, ".lookahead_slots: expected an integer"},
      {{"free_deferral_steps", -3}, ".free_deferral_steps: out of range: -3 (0 .. 65536)"},
      {{"free_deferral_steps", Json(std::uint64_t{18446744073709551615u})},
       ".free_deferral_steps: out of range: 18446744073709551615 (at most 65536)"},
      {{"free_deferral_steps", true}, ".free_deferral_steps: expected an integer"},
  };
  for (const auto& [entry, expected] : twists) {
    INFO(expected);
    Json bad = h;
    bad["capabilities"][entry.first] = entry.second;
    CHECK(error_of(bad) == "hello answer.capabilities" + expected);
  }
  // Lookahead is room in a paged pool; a deadline on frees needs frees.
  Json ring = ring_hello();
  ring["capabilities"]["lookahead_slots"] = 2;
  CHECK_THAT(error_of(ring),
             Catch::StartsWith("hello answer.capabilities.lookahead_slots: lookahead slots need "
                               "\"addressing\": \"paged\" with a block_size"));
  ring["capabilities"]["lookahead_slots"] = 0;  // none: fine anywhere
  CHECK(error_of(ring).empty());
  ring["capabilities"]["free_deferral_steps"] = 1;
  CHECK_THAT(error_of(ring),
             Catch::StartsWith("hello answer.capabilities.free_deferral_steps: a free deferral "
                               "needs frees reported"));
}

TEST_CASE("ExecHello: per_layer_windows is off unless declared, and must be a boolean") {
  CHECK_FALSE(parse_hello_answer(ring_hello(), "cmd").per_layer_windows);
  Json with = ring_hello();
  with["capabilities"]["per_layer_windows"] = true;
  CHECK(parse_hello_answer(with, "cmd").per_layer_windows);
  with["capabilities"]["per_layer_windows"] = 1;
  CHECK(error_of(with).find(".capabilities.per_layer_windows") != std::string::npos);
}

TEST_CASE("ExecHello: shared_pool sizes one pool for the sum of the layers and bounds them together") {
  namespace en = kvcheck::engines;
  CHECK_FALSE(parse_hello_answer(ring_hello(), "cmd").shared_pool);  // off unless declared
  Json h = paged_hello();
  h["capabilities"]["shared_pool"] = true;
  Capabilities c = parse_hello_answer(h, "cmd");
  CHECK(c.shared_pool);
  en::CacheSpec spec;
  spec.cache.states = 3;
  spec.cache.layers = 3;
  spec.cache.ring_rows = 12;
  spec.window_keys = 8;
  spec.max_step_rows = 9;
  // Each layer's share is the pool of one layer: ceil(max(12, 8 - 1 + 9) / 4) + 1 = 5 blocks per state.
  CHECK(en::layer_pool_blocks(spec, c, 0) == 3 * 5);
  CHECK(en::paged_pool_blocks(spec, c) == 3 * 3 * 5);
  CHECK(en::resident_limit(c, spec) == 3 * 5);  // per request: the shared pool over the states
  // Layer windows: a sliding layer wider than the case's window needs more,
  // a global one the capacity (max(12, 8 - 1 + 9) = 16 rows as the case's window).
  spec.layer_window_keys = {8, 20, kvcheck::scenarios::kGlobalWindowKeys};
  CHECK(en::layer_pool_blocks(spec, c, 1) == 3 * (7 + 1));  // ceil((20 - 1 + 9) / 4) + 1
  CHECK(en::layer_pool_blocks(spec, c, 2) == 3 * 5);
  CHECK(en::paged_pool_blocks(spec, c) == 3 * (5 + 8 + 5));
  // Not shared: one layer's pool, whatever the layers.
  c.shared_pool = false;
  spec.layer_window_keys.clear();
  CHECK(en::paged_pool_blocks(spec, c) == 3 * 5);
  // A bound in rows over the shared pool: every layer's rows together.
  c.shared_pool = true;
  c.resident_bound.unit = en::ResidentBound::Unit::kRows;
  CHECK(en::resident_limit(c, spec) == 3 * 12);
  c.resident_bound.per_request = false;
  CHECK(en::resident_limit(c, spec) == 3 * 3 * 12);
  // An explicit pool (a scenario's pool_blocks, the sweep's) is the shared pool as given.
  spec.pool_blocks = 7;
  CHECK(en::paged_pool_blocks(spec, c) == 7);

  Json bad = h;
  bad["capabilities"]["shared_pool"] = 1;
  CHECK(error_of(bad) == "hello answer.capabilities.shared_pool: expected true or false");
  Json ring = ring_hello();
  ring["capabilities"]["shared_pool"] = true;
  CHECK_THAT(error_of(ring),
             Catch::StartsWith("hello answer.capabilities.shared_pool: a pool shared by the layers "
                               "needs \"addressing\": \"paged\" or \"opaque\""));
  ring["capabilities"]["shared_pool"] = false;  // declared off: fine anywhere
  CHECK(error_of(ring).empty());
}

TEST_CASE("ExecHello: recompute_in_step makes room in the pool for a begin's rows and a step's at once") {
  namespace en = kvcheck::engines;
  CHECK_FALSE(parse_hello_answer(ring_hello(), "cmd").recompute_in_step);  // off unless declared
  Json h = paged_hello();
  h["capabilities"]["prefix_sharing"] = true;
  h["capabilities"]["recompute_in_step"] = true;
  Capabilities c = parse_hello_answer(h, "cmd");
  CHECK(c.recompute_in_step);
  en::CacheSpec spec;
  spec.cache.states = 2;
  spec.cache.ring_rows = 12;
  spec.window_keys = 8;
  spec.max_step_rows = 4;
  // No begin carries rows: R = max(12, 8 - 1 + 4) = 12, ceil(12 / 4) + 1 = 4 blocks per state.
  CHECK(en::paged_pool_blocks(spec, c) == 2 * 4);
  // A prefix of 21 positions: R = 21 + 4 = 25 rows, ceil(25 / 4) + 1 = 8 blocks per state
  // (adapters/PROTOCOL.md "Capacity"), the same for one layer's share of a shared pool.
  spec.max_begin_rows = 21;
  CHECK(en::paged_pool_blocks(spec, c) == 2 * 8);
  CHECK(en::layer_pool_blocks(spec, c, 0) == 2 * 8);
  // Undeclared, the begin's rows are stored at the begin: no room for both.
  c.recompute_in_step = false;
  CHECK(en::paged_pool_blocks(spec, c) == 2 * 4);

  Json bad = h;
  bad["capabilities"]["recompute_in_step"] = "yes";
  CHECK(error_of(bad) == "hello answer.capabilities.recompute_in_step: expected true or false");
}
