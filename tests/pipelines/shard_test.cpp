// Shard documents: a check shard's tally round-trips, and a set of shards
// that is not exactly one whole run is refused naming the shard at fault.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "pipelines/shard.hpp"
#include "support/error.hpp"

using namespace kvcheck;

namespace {

pipelines::CheckShardOptions some_options() {
  pipelines::CheckShardOptions o;
  o.impl = "cpu";
  o.fault = "none";
  o.cases = 10;
  o.seed = 7;
  o.command = "kvcheck check --cases 10 --seed 7";
  return o;
}

properties::CaseTally tally_of(std::int64_t index, std::int64_t count, std::int64_t cases) {
  properties::CaseTally t;
  t.cases = index < cases ? (cases - index + count - 1) / count : 0;
  t.coverage_counts = {1, 2, 0, 3};  // at most the cases a shard of 3 runs
  t.reachable = {true, true, false, true};
  return t;
}

pipelines::ShardResult shard(std::int64_t index, std::int64_t count, const pipelines::CheckShardOptions& o,
                           const properties::CaseTally& t) {
  return pipelines::parse_shard(pipelines::shard_text("check", "0.1.0", index, count,
                                                  pipelines::check_options_json(o), pipelines::tally_json(t)),
                              "dir" + std::to_string(index) + "/shard.json");
}

int error_id(const std::function<void()>& f, std::string* what) {
  try {
    f();
  } catch (const Error& e) {
    *what = e.what();
    return static_cast<int>(e.id());
  }
  return 0;
}

}  // namespace

TEST_CASE("Shard: a check shard's options and tally round-trip through its document") {
  properties::CaseTally t = tally_of(1, 3, 10);
  t.failures = 2;
  t.first_failing_case = 4;
  t.failing_cases = {4, 7};  // every failing case of shard 1/3 (cases 1, 4, 7)
  t.observed = "slots";
  const pipelines::ShardResult s = shard(1, 3, some_options(), t);
  CHECK(s.kind == "check");
  CHECK(s.index == 1);
  CHECK(s.count == 3);
  CHECK(pipelines::tally_from_json(s, 10, 4) == t);
  const pipelines::CheckShardOptions o = pipelines::check_options_from_json(s);
  CHECK(o.seed == 7);
  CHECK(o.command == some_options().command);
  // --case-seed and --no-coverage-gate: written only when given, read back.
  CHECK_FALSE(o.case_seed);
  CHECK(o.coverage_gate);
  CHECK_FALSE(pipelines::check_options_json(some_options()).contains("case_seed"));
  pipelines::CheckShardOptions one = some_options();
  one.case_seed = 18446744073709551615ull;
  one.coverage_gate = false;
  const pipelines::CheckShardOptions back = pipelines::check_options_from_json(shard(0, 1, one, tally_of(0, 1, 1)));
  CHECK(back.case_seed == one.case_seed);
  CHECK_FALSE(back.coverage_gate);
}

TEST_CASE("Shard: missing, duplicated and mismatched shards are refused naming the shard") {
  const auto o = some_options();
  std::string what;
  CHECK(error_id(
            [&] {
              pipelines::order_shards({shard(0, 3, o, tally_of(0, 3, 10)), shard(2, 3, o, tally_of(2, 3, 10))});
            },
            &what) == 700);
  CHECK(what.find("at shard 1/3: missing") != std::string::npos);
  CHECK(error_id(
            [&] {
              pipelines::order_shards({shard(0, 2, o, tally_of(0, 2, 10)), shard(0, 2, o, tally_of(0, 2, 10))});
            },
            &what) == 700);
  CHECK(what.find("given twice") != std::string::npos);
  auto other = o;
  other.seed = 8;
  CHECK(error_id(
            [&] {
              pipelines::order_shards(
                  {shard(0, 2, o, tally_of(0, 2, 10)), shard(1, 2, other, tally_of(1, 2, 10))});
            },
            &what) == 700);
  CHECK(what.find("dir1/shard.json: options.seed is 8") != std::string::npos);
  const auto ordered =
      pipelines::order_shards({shard(1, 2, o, tally_of(1, 2, 10)), shard(0, 2, o, tally_of(0, 2, 10))});
  REQUIRE(ordered.size() == 2);
  CHECK(ordered[0].index == 0);
}

TEST_CASE("Shard: a tally that is not its shard's cases, or a stray key, is refused") {
  const auto o = some_options();
  properties::CaseTally t = tally_of(1, 3, 10);
  t.cases += 1;
  std::string what;
  CHECK(error_id([&] { pipelines::tally_from_json(shard(1, 3, o, t), 10, 4); }, &what) == 700);
  CHECK(what.find("dir1/shard.json: result.cases") != std::string::npos);
  t = tally_of(1, 3, 10);
  t.failures = 1;
  t.first_failing_case = 3;  // 3 mod 3 is shard 0's
  CHECK(error_id([&] { pipelines::tally_from_json(shard(1, 3, o, t), 10, 4); }, &what) == 700);
  CHECK(what.find("first_failing_case") != std::string::npos);
  std::string text = pipelines::shard_text("check", "0.1.0", 0, 1, pipelines::check_options_json(o),
                                         pipelines::tally_json(tally_of(0, 1, 10)));
  text.insert(1, "\"extra\": 1,");
  CHECK(error_id([&] { pipelines::parse_shard(text, "x/shard.json"); }, &what) == 202);
  CHECK(what.find("x/shard.json") != std::string::npos);
}

TEST_CASE("Shard: impossible tallies are refused with error 700 naming shard and field") {
  const auto o = some_options();
  std::string what;
  // A coverage class counted in more cases than the shard ran (3 of 10 in shard 1/3).
  properties::CaseTally t = tally_of(1, 3, 10);
  t.coverage_counts[1] = 4;
  CHECK(error_id([&] { pipelines::tally_from_json(shard(1, 3, o, t), 10, 4); }, &what) == 700);
  CHECK(what.find("dir1/shard.json: result.coverage_counts[1]") != std::string::npos);
  // ... or in more than ran: a skipped case counts no class.
  t = tally_of(1, 3, 10);
  t.skipped = 1;
  CHECK(error_id([&] { pipelines::tally_from_json(shard(1, 3, o, t), 10, 4); }, &what) == 700);
  CHECK(what.find("result.coverage_counts[3]") != std::string::npos);
  t = tally_of(1, 3, 10);
  t.coverage_counts[0] = -1;
  CHECK(error_id([&] { pipelines::tally_from_json(shard(1, 3, o, t), 10, 4); }, &what) == 700);
  CHECK(what.find("result.coverage_counts[0]") != std::string::npos);
  t = tally_of(1, 3, 10);
  t.failures = -1;
  CHECK(error_id([&] { pipelines::tally_from_json(shard(1, 3, o, t), 10, 4); }, &what) == 700);
  CHECK(what.find("result.failures") != std::string::npos);
  // Exactly as many as ran is a tally a run can have.
  t = tally_of(1, 3, 10);
  t.coverage_counts = {3, 3, 0, 3};
  CHECK(pipelines::tally_from_json(shard(1, 3, o, t), 10, 4) == t);
}

TEST_CASE("Shard: options no check run can have are refused with error 700 naming the field") {
  const auto refused = [](const std::function<void(pipelines::CheckShardOptions&)>& edit,
                          const std::string& field) {
    auto o = some_options();
    edit(o);
    std::string what;
    const int id =
        error_id([&] { pipelines::check_options_from_json(shard(0, 1, o, tally_of(0, 1, 10))); }, &what);
    CHECK(id == 700);
    CHECK(what.find("dir0/shard.json: " + field) != std::string::npos);
  };
  refused([](auto& o) { o.precision_requested = 7; }, "options.precision_requested");
  refused([](auto& o) { o.precision_requested = 114; }, "options.precision_requested");
  refused([](auto& o) { o.cases = INT64_MAX; }, "options.cases");
  refused([](auto& o) { o.cases = pipelines::kMaxCheckCases + 1; }, "options.cases");
  refused([](auto& o) { o.seed = UINT64_MAX; }, "options.seed");
  refused([](auto& o) { o.step_timeout_seconds = 0; }, "options.step_timeout_seconds");
  refused([](auto& o) { o.impl = "sh -c true"; }, "options.impl");
  refused([](auto& o) { o.impl = "exec:"; }, "options.impl");
  for (const int bits : {53, 113, 169}) {
    auto o = some_options();
    o.precision_requested = bits;
    CHECK(pipelines::check_options_from_json(shard(0, 1, o, tally_of(0, 1, 10))).precision_requested == bits);
  }
}
