// Catch2's main, in its own translation unit (compiled once, in parallel with the test).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
