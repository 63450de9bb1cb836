// The probe of the ctest entry "ctest hygiene: ...": hidden test cases run
// only by that entry. Through the shared main (tests/catch_main.cpp) the one
// that asserts nothing must fail, the one that asserts must pass, and a name
// that matches no test case (half of a name split at ';') must fail.
#include <catch2/catch.hpp>

TEST_CASE("Hygiene probe: a test case that asserts nothing", "[.hygiene-empty]") {}

TEST_CASE("Hygiene probe: a test case that asserts", "[.hygiene-asserts]") {
  CHECK(sizeof(int) >= 2);
}
