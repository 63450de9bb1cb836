// Every number of docs/semantics.md "Golden values" that the reference model owns, recomputed here.
#include <catch2/catch.hpp>

#include "model/address.hpp"
#include "model/attention_lab.hpp"
#include "model/bytes.hpp"
#include "model/layer_fixture.hpp"
#include "support/formats.hpp"

using namespace kvcheck::model;

namespace {
std::vector<std::int64_t> counts(const std::vector<std::vector<std::int64_t>>& lists) {
  std::vector<std::int64_t> out;
  for (const auto& l : lists) out.push_back(static_cast<std::int64_t>(l.size()));
  return out;
}
}  // namespace

TEST_CASE("AttentionLab: full causal reproduces docs/semantics.md counts and last output") {
  const LabRun run = run_attention_lab(std::nullopt);
  CHECK(run.recompute.projected_rows == 15);
  CHECK(run.cache.projected_rows == 5);
  CHECK(run.recompute.pairs == 35);
  CHECK(run.cache.pairs == 15);
  CHECK(run.cache.retained_rows == 5);
  REQUIRE(run.last_output.size() == 2);
  CHECK(run.last_output[0] == Approx(2.790791).margin(5e-7));
  CHECK(run.last_output[1] == Approx(0.930264).margin(5e-7));
  CHECK(run.max_abs_difference <= 1e-12);
  CHECK(run.max_rel_difference <= 1e-12);
}

TEST_CASE("AttentionLab: window 3 reproduces docs/semantics.md counts and output (3, 1)") {
  const LabRun run = run_attention_lab(3);
  CHECK(run.recompute.projected_rows == 15);
  CHECK(run.cache.projected_rows == 5);
  CHECK(run.recompute.pairs == 31);
  CHECK(run.cache.pairs == 12);
  CHECK(run.cache.retained_rows == 3);
  CHECK(run.last_output[0] == Approx(3.0).margin(1e-15));
  CHECK(run.last_output[1] == Approx(1.0).margin(1e-15));
  CHECK(run.max_abs_difference <= 1e-12);
}

TEST_CASE("AttentionLab: window 1 returns each value row, a large window equals causal") {
  const LabRun one = run_attention_lab(1);
  CHECK(one.last_output[0] == Approx(4.0).margin(1e-15));  // value of (0,2) is (4,-2)
  CHECK(one.last_output[1] == Approx(-2.0).margin(1e-15));
  const LabRun wide = run_attention_lab(50);
  const LabRun full = run_attention_lab(std::nullopt);
  CHECK(wide.last_output == full.last_output);
  CHECK(wide.cache.pairs == full.cache.pairs);
}

TEST_CASE("Bytes: full and window KV payloads and the shared fp8 row") {
  CHECK(kv_payload_bytes(32, 8, 128, 4096, 2) == 536870912);
  CHECK(*kv_payload_bytes(32, 8, 128, 4096, 2) == 512LL * 1024 * 1024);
  CHECK(kv_payload_bytes(32, 8, 128, 128, 2) == 16777216);
  CHECK(*kv_payload_bytes(32, 8, 128, 128, 2) == 16LL * 1024 * 1024);
  CHECK(kvcheck::format_row_bytes(kvcheck::ElementFormat::kFp8, 512) == 528);
  CHECK(rows_bytes(128, kvcheck::format_row_bytes(kvcheck::ElementFormat::kFp8, 512)) == 67584);
  CHECK(rows_bytes(134, kvcheck::format_row_bytes(kvcheck::ElementFormat::kFp8, 512)) == 70752);
  CHECK_FALSE(kv_payload_bytes(1LL << 40, 1LL << 20, 128, 4096, 2).has_value());
}

TEST_CASE("RingTrace: W=128, S=134, state 2 reproduces docs/semantics.md table") {
  const Ring ring{3, 134, 128};
  struct Row {
    std::int64_t position, first, last, first_slot, last_slot, write_slot;
  };
  const Row table[] = {{127, 0, 127, 268, 395, 395},
                       {128, 1, 128, 269, 396, 396},
                       {133, 6, 133, 274, 401, 401},
                       {134, 7, 134, 275, 268, 268}};
  for (const Row& row : table) {
    INFO("position " << row.position);
    const DecodeMeta m = decode_meta(2, row.position, ring);
    CHECK(m.start == row.first);
    CHECK(m.start + m.length - 1 == row.last);
    CHECK(m.read_offset == row.first_slot);
    CHECK(m.last_read_slot == row.last_slot);
    CHECK(m.write_slot == row.write_slot);
    const auto index = expand_index(2, row.position, ring, 128);
    CHECK(index.front() == row.first_slot);
    CHECK(index.back() == row.last_slot);
  }
}

TEST_CASE("RingTrace: state 3 at position 134 reads 409..402 and writes 402") {
  const Ring ring{4, 134, 128};
  const DecodeMeta m = decode_meta(3, 134, ring);
  CHECK(m.read_offset == 409);
  CHECK(m.last_read_slot == 402);
  CHECK(m.write_slot == 402);
  for (const std::int64_t slot : expand_index(3, 134, ring, 128)) {
    CHECK(slot >= 402);  // none belongs to state 2 (268..401)
    CHECK(slot <= 535);
  }
}

TEST_CASE("Verify: six queries after six stores lose [5,4,3,2,1,0] at S=128, none at 133 and 134") {
  const std::pair<std::int64_t, std::vector<std::int64_t>> cases[] = {
      {128, {5, 4, 3, 2, 1, 0}}, {133, {0, 0, 0, 0, 0, 0}}, {134, {0, 0, 0, 0, 0, 0}}};
  for (const auto& [ring_rows, expected] : cases) {
    INFO("S = " << ring_rows);
    SlotOracle oracle(Ring{1, ring_rows, 128});
    const std::int64_t p = 300;  // full window, several wraps
    apply_step(oracle, 0, 0, 0, p, /*store_before_read=*/false);
    const auto lost = apply_step(oracle, 0, 0, p, 6, /*store_before_read=*/true);
    CHECK(counts(lost) == expected);
  }
}

TEST_CASE("Prefill: W=3, S=5, chunks 4..6, 4..7, 4..8 in both orders") {
  struct Case {
    std::int64_t rows;
    bool store_first;
    std::vector<std::vector<std::int64_t>> lost;
  };
  const Case cases[] = {
      {3, true, {{}, {}, {}}},  {4, true, {{2}, {}, {}, {}}}, {5, true, {{2, 3}, {3}, {}, {}, {}}},
      {3, false, {{}, {}, {}}}, {4, false, {{}, {}, {}, {}}}, {5, false, {{}, {}, {}, {}, {}}},
  };
  for (const Case& c : cases) {
    INFO("chunk 4.." << 3 + c.rows << (c.store_first ? " store_then_load" : " load_then_store"));
    SlotOracle oracle(Ring{1, 5, 3});
    apply_step(oracle, 0, 0, 0, 4, false);  // cached prefix ends at position 3
    CHECK(apply_step(oracle, 0, 0, 4, c.rows, c.store_first) == c.lost);
  }
  // The chunk 4..7 overwrites position 2 in slot 2.
  SlotOracle oracle(Ring{1, 5, 3});
  apply_step(oracle, 0, 0, 0, 4, false);
  apply_step(oracle, 0, 0, 4, 4, true);
  CHECK(oracle.at(2).position == 7);
}

TEST_CASE("LayerFixture: three appends reproduce the seed's outputs, rows, weights and counts") {
  const LayerEvidence ev = run_layer_fixture(seed_layer_fixture());
  const std::vector<std::vector<double>> expected = {{1, 0, 1, 0},
                                                     {0.213809009, 0.786190991, 0.770151153, -0.420735492},
                                                     {0.629044078, 0.945303958, 0.374718490, -0.583589471}};
  REQUIRE(ev.steps.size() == 3);
  for (std::size_t t = 0; t < 3; ++t) {
    INFO("step " << t);
    for (std::size_t d = 0; d < 4; ++d) {
      CHECK(ev.steps[t].cached_output[d] == Approx(expected[t][d]).margin(5e-10));
    }
    CHECK(ev.steps[t].max_abs_difference <= 1e-12);
  }
  // The seed's printed weights and rotated keys of head 1 at position 2.
  CHECK(ev.steps[2].weights[1][0] == Approx(0.054696042457).margin(5e-13));
  CHECK(ev.steps[2].weights[1][1] == Approx(0.370955922197).margin(5e-13));
  CHECK(ev.steps[2].weights[1][2] == Approx(0.574348035346).margin(5e-13));
  CHECK(ev.steps[1].weights[1][0] == Approx(0.213809008676).margin(5e-13));
  CHECK(ev.steps[2].keys[1][0] == Approx(-1.325444263).margin(5e-10));
  CHECK(ev.steps[2].keys[1][1] == Approx(0.493150590).margin(5e-10));
  CHECK(ev.steps[2].values[0][0] == Approx(-0.416146837).margin(5e-10));
  CHECK(ev.steps[2].keys[0][0] == Approx(1.0).margin(1e-15));
  CHECK(ev.full_prefix_rows == 6);
  CHECK(ev.incremental_rows == 3);
  CHECK(ev.reused_rows == 3);
}
