// cli/args: numeric flags read as decimal only, out-of-range values named by
// their flag (issue 19: `--step-timeout 0x10` used to mean 16 s).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cli/args.hpp"
#include "support/error.hpp"

using namespace kvcheck;
using namespace kvcheck::cli;

namespace {

/// Args over `words` (argv[0] and the command prepended).
Args args_of(std::vector<std::string> words) {
  words.insert(words.begin(), {"kvcheck", "test"});
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  return Args(static_cast<int>(argv.size()), argv.data(), 2, {"--step-timeout", "--cases"}, {});
}

/// The error text of `f`, checking it is kUsage at `flag`; empty when nothing was thrown.
template <typename F>
std::string usage_error(const std::string& flag, F f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.id() == ErrorId::kUsage);
    CHECK(e.where() == flag);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Args: seconds are decimal only, 0x10 is an error naming the flag") {
  for (const char* bad :
       {"0x10", "0X10", "1e3", "inf", "nan", " 5", "5 ", "+5", "-5", "0", "5.", ".", "", "1.5s"}) {
    INFO(bad);
    const Args a = args_of({"--step-timeout", bad});
    CHECK_THAT(usage_error("--step-timeout", [&] { a.seconds("--step-timeout", 10, 86400); }),
               Catch::Contains("decimal seconds"));
  }
  CHECK(args_of({"--step-timeout", "16"}).seconds("--step-timeout", 10, 86400) == 16.0);
  CHECK(args_of({"--step-timeout", "0.25"}).seconds("--step-timeout", 10, 86400) == 0.25);
  CHECK(args_of({"--step-timeout", ".5"}).seconds("--step-timeout", 10, 86400) == 0.5);
  CHECK(args_of({}).seconds("--step-timeout", 10, 86400) == 10.0);
  CHECK_THAT(usage_error("--step-timeout",
                         [&] {
                           args_of({"--step-timeout", "86401"}).seconds("--step-timeout", 10, 86400);
                         }),
             Catch::Contains("(0, 86400]"));
}

TEST_CASE("Args: integers are decimal only, out of range names the flag") {
  for (const char* bad : {"0x10", "010x", " 7", "7 ", "+7", "1e3", "-", "--1", "7.0", ""}) {
    INFO(bad);
    CHECK_FALSE(usage_error("--cases", [&] { parse_integer("--cases", bad, 0, 1000); }).empty());
  }
  CHECK(parse_integer("--cases", "010", 0, 1000) == 10);  // leading zeros are still decimal
  CHECK(parse_integer("--cases", "-3", -5, 5) == -3);
  CHECK_THAT(usage_error("--cases", [&] { parse_integer("--cases", "18446744073709551615", 0, 1000); }),
             Catch::Contains("must be in 0..1000"));
  CHECK_THAT(usage_error("--cases", [&] { parse_integer("--cases", "1001", 0, 1000); }),
             Catch::Contains("must be in 0..1000"));
  CHECK_THAT(usage_error("--cases",
                         [&] {
                           args_of({"--cases", "0x10"}).integer("--cases", 1, 1, 100);
                         }),
             Catch::Contains("decimal integer"));
}
