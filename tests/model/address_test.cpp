// The address oracle against hand-derived cases and its own invariants.
#include <rapidcheck.h>
#include <catch2/catch.hpp>

#include "model/address.hpp"

using namespace kvcheck::model;

TEST_CASE("Visible: the three window conventions show W, left + 1 and W + 1 keys") {
  CHECK(visible_range(10, Window{4, WindowConvention::kKeys}).first == 7);
  CHECK(visible_range(10, Window{4, WindowConvention::kLeft}).first == 6);
  CHECK(visible_range(10, Window{4, WindowConvention::kOffByOne}).first == 6);
  CHECK(visible_range(2, Window{4, WindowConvention::kKeys}).first == 0);
  CHECK(visible_range(10, Window{}).first == 0);
  CHECK(visible_range(10, Window{}).count() == 11);
  WindowConvention c{};
  CHECK(parse_convention("off-by-one", &c));
  CHECK(c == WindowConvention::kOffByOne);
  CHECK_FALSE(parse_convention("right", &c));
}

TEST_CASE("Address: a short request pads its index with -1 and never reads unfilled rows") {
  const Ring ring{2, 7, 5};
  const auto index = expand_index(1, 2, ring, 5);
  CHECK(index == std::vector<std::int64_t>{7, 8, 9, -1, -1});
  const auto wrapped = expand_index(1, 9, ring, 5);  // positions 5..9 -> slots 12,13,7,8,9
  CHECK(wrapped == std::vector<std::int64_t>{12, 13, 7, 8, 9});
}

TEST_CASE("Address: index columns stay inside the state's block and cover the window") {
  const bool holds = rc::check([](std::uint8_t states_raw, std::uint8_t ring_raw, std::uint8_t window_raw,
                                  std::uint16_t position_raw) {
    const std::int64_t states = states_raw % 5 + 1;
    const std::int64_t ring_rows = ring_raw % 17 + 1;
    const std::int64_t window = window_raw % ring_rows + 1;
    const std::int64_t state = states_raw % states;
    const std::int64_t p = position_raw;
    const Ring ring{states, ring_rows, window};
    const auto index = expand_index(state, p, ring, window);
    const DecodeMeta m = decode_meta(state, p, ring);
    RC_ASSERT(m.length == std::min(p + 1, window));
    for (std::int64_t c = 0; c < window; ++c) {
      const std::int64_t slot = index[static_cast<std::size_t>(c)];
      if (c < m.length) {
        RC_ASSERT(slot / ring_rows == state);
        RC_ASSERT(slot == state * ring_rows + (m.start + c) % ring_rows);
      } else {
        RC_ASSERT(slot == -1);
      }
    }
  });
  CHECK(holds);  // rc::check reports to stdout only: its verdict is asserted here
}

TEST_CASE("SlotOracle: writes replace tags in order with increasing sequence numbers") {
  SlotOracle oracle(Ring{2, 3, 2});
  CHECK(oracle.at(4).request == -1);
  CHECK(oracle.write(1, 9, 1).request == -1);
  const SlotTag replaced = oracle.write(1, 10, 4);  // 4 mod 3 = 1 -> slot 4 again
  CHECK(replaced == SlotTag{9, 1, 1});
  CHECK(oracle.at(4) == SlotTag{10, 4, 2});
  CHECK(oracle.writes() == 2);
}

TEST_CASE("SlotOracle: a ring of exactly W rows loses rows to decode only when the step stores first") {
  SlotOracle oracle(Ring{1, 4, 4});
  apply_step(oracle, 0, 0, 0, 10, false);
  const auto lost = apply_step(oracle, 0, 0, 10, 1, true);
  CHECK(lost[0].empty());  // decode: its own write replaces position 6, out of the window
  const auto verify = apply_step(oracle, 0, 0, 11, 2, true);
  CHECK(verify[0] == std::vector<std::int64_t>{8});  // position 12 overwrote slot of 8
  CHECK(verify[1].empty());
}
