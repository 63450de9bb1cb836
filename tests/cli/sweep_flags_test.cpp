// The sweep's grid flags read in cli/: value lists and prefill orders, and
// the errors that name the flag.
#include <catch2/catch.hpp>

#include "cli/sweep_flags.hpp"
#include "support/error.hpp"

using namespace kvcheck;
using namespace kvcheck::cli;
using sweep::SweepOrder;

TEST_CASE("Sweep: bad ranges throw kUsage naming the flag") {
  auto error_of = [](const std::string& flag, const std::string& text, std::int64_t lo) -> std::string {
    try {
      parse_value_list(flag, text, lo, 1 << 20);
    } catch (const Error& e) {
      CHECK(e.id() == ErrorId::kUsage);
      CHECK(e.where() == flag);
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error_of("--window", "200:100", 1), Catch::Contains("200 > 100"));
  CHECK_THAT(error_of("--window", "0", 1), Catch::Contains("must be in 1.."));
  CHECK_THAT(error_of("--window", "0:64", 1), Catch::Contains("must be in 1.."));
  CHECK_THAT(error_of("--window", "64:128:0", 1), Catch::Contains("step 0"));
  CHECK_THAT(error_of("--drafts", "a:3", 0), Catch::Contains("'a:3'"));
  CHECK_THAT(error_of("--drafts", "1:2:3:4", 0), Catch::Contains("A:B:STEP"));
  CHECK_THAT(error_of("--chunk", "", 1), Catch::Contains("empty"));
  CHECK_THAT(error_of("--chunk", "-3", 1), Catch::Contains("'-3'"));
  CHECK(parse_value_list("--window", "64:256:64", 1, 100000) == std::vector<std::int64_t>{64, 128, 192, 256});
  CHECK(parse_value_list("--chunk", "1,16,256", 1, 100000) == std::vector<std::int64_t>{1, 16, 256});
  CHECK(parse_value_list("--drafts", "0:4:2,3,4", 0, 10) == std::vector<std::int64_t>{0, 2, 3, 4});
  CHECK_THROWS_WITH(parse_value_list("--drafts", "1,3:1", 0, 10), Catch::Contains("3 > 1"));
  CHECK_THROWS_AS(parse_orders("--order", "sideways"), Error);
  CHECK(parse_orders("--order", "both").size() == 2);
  CHECK(parse_orders("--order", "store_then_load") == std::vector<SweepOrder>{SweepOrder::kStoreThenLoad});
}
