// The judge against an independent simple model (issue 18 item 8): random
// steps with reported writes and reads (correct ones, and reads dropped,
// added, duplicated or replaced by stale copies; writes anywhere in the
// pool) go through the shadow map, and a model written here — a slot table,
// the latest write of each position, counts by definition — says what each
// query lost, what it read that no visible row accounts for, and which writes
// collided. Then judge_run's verdict is checked against the same definition:
// a run fails exactly when some query lost or misread a row, some output was
// out of tolerance, some step collided or stored a wrong row.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "properties/shadow.hpp"
#include "properties/verdict.hpp"
#include "support/prng.hpp"

namespace {

using namespace kvcheck;
using namespace kvcheck::properties;

/// The model: what each slot holds, and the latest write of each position.
struct Model {
  struct Row {
    std::int64_t request = -1, position = -1;
    std::uint64_t seq = 0;
  };
  std::map<std::int64_t, Row> table;
  std::map<std::pair<std::int64_t, std::int64_t>, std::pair<std::uint64_t, std::int64_t>>
      latest;                                                                          // seq, slot
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::int64_t>> history;  // every slot
  std::uint64_t seq = 0;
  Row at(std::int64_t slot) const {
    const auto it = table.find(slot);
    return it == table.end() ? Row{} : it->second;
  }
};

}  // namespace

TEST_CASE("Judge: the shadow map's counts equal an independent model's on mutated reads and writes") {
  Prng rng(2718);
  std::int64_t extra_seen = 0, stale_seen = 0, lost_seen = 0, outside_seen = 0, same_seen = 0;
  for (int c = 0; c < 300; ++c) {
    const std::int64_t ring = 2 + static_cast<std::int64_t>(rng.below(6));
    const std::int64_t states = 1 + static_cast<std::int64_t>(rng.below(3));
    const std::int64_t keys = 1 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(ring)));
    ShadowMap shadow;
    Model m;
    std::vector<std::int64_t> length(static_cast<std::size_t>(states), 0);
    for (int s = 0; s < 12; ++s) {
      const std::int64_t r = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(states)));
      const std::int64_t state = r;  // request r lives on state r
      // Now and then the step starts a little back (rejected drafts written
      // again, a prompt cut back): positions are rewritten, and a write that
      // went elsewhere leaves a stale copy.
      const std::int64_t back = rng.chance(1, 4) ? static_cast<std::int64_t>(rng.below(3)) : 0;
      const std::int64_t first = std::max<std::int64_t>(0, length[static_cast<std::size_t>(r)] - back);
      const std::int64_t n = 1 + static_cast<std::int64_t>(rng.below(3));
      std::vector<std::int64_t> written;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = first + i;
        written.push_back(
            rng.chance(1, 8) ? static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(states * ring)))
                             : state * ring + p % ring);
      }
      // Expected collisions, by definition, from the table before the step.
      std::int64_t same = 0, outside = 0, replaced = 0;
      std::map<std::int64_t, int> times;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t slot = written[static_cast<std::size_t>(i)];
        if (++times[slot] == 2) ++same;
        if (slot < state * ring || slot >= (state + 1) * ring) ++outside;
        const Model::Row old = m.at(slot);
        if (old.request == r && old.position < first && old.position >= first - keys + 1 &&
            m.latest[{r, old.position}].first == old.seq) {
          ++replaced;
        }
      }
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t slot = written[static_cast<std::size_t>(i)];
        const Model::Row row{r, first + i, ++m.seq};
        m.table[slot] = row;
        m.latest[{r, first + i}] = {row.seq, slot};
        m.history[{r, first + i}].push_back(slot);
      }
      // Reads: the latest slot of each visible position, then mutations.
      std::vector<std::int64_t> offsets{0}, slots;
      struct Expect {
        std::int64_t lost = 0, extra = 0;
        std::set<std::int64_t> must_lose;
      };
      std::vector<Expect> expect;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = first + i;
        const std::int64_t vf = std::max<std::int64_t>(0, p - keys + 1);
        std::vector<std::int64_t> reads;
        Expect e;
        for (std::int64_t j = vf; j <= p; ++j) {
          const std::uint64_t roll = rng.below(16);
          const auto& hist = m.history[{r, j}];
          if (roll == 0) {
            e.must_lose.insert(j);  // dropped (unless another read happens to hold it)
            continue;
          }
          if (roll <= 2 && hist.size() > 1 && hist.front() != m.latest[{r, j}].second) {
            reads.push_back(hist.front());  // an older slot of the position
            continue;
          }
          reads.push_back(m.latest[{r, j}].second);
          if (roll == 3) reads.push_back(m.latest[{r, j}].second);  // read twice
        }
        if (rng.chance(1, 5))
          reads.push_back(static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(states * ring))));
        if (rng.chance(1, 10)) reads.push_back(-1);  // padding: ignored
        // By definition: a visible position is read correctly when some read
        // slot holds its latest write; every other read is lost or extra.
        std::int64_t correct = 0, nonneg = 0;
        std::set<std::int64_t> correct_positions;
        std::multiset<std::int64_t> read_set;
        for (const std::int64_t slot : reads) {
          if (slot >= 0) {
            ++nonneg;
            read_set.insert(slot);
          }
        }
        for (std::int64_t j = vf; j <= p; ++j) {
          const auto [seq, home] = m.latest[{r, j}];
          const Model::Row row = m.at(home);
          if (read_set.count(home) > 0 && row.request == r && row.position == j && row.seq == seq) {
            ++correct;
            correct_positions.insert(j);
          }
        }
        for (const std::int64_t j : correct_positions) e.must_lose.erase(j);
        e.lost = (p - vf + 1) - correct;
        e.extra = nonneg - correct;  // minus the reads claimed as overwritten (below)
        expect.push_back(e);
        slots.insert(slots.end(), reads.begin(), reads.end());
        offsets.push_back(static_cast<std::int64_t>(slots.size()));
      }
      StepFacts f;
      f.request = r;
      f.state = state;
      f.first_position = first;
      f.rows = n;
      f.window_keys = keys;
      f.has_written = f.has_reads = true;
      f.written = written;
      f.read_offsets = offsets;
      f.read_slots = slots;
      f.ring = true;
      f.ring_rows = ring;
      StepObservation obs;
      shadow.observe(f, &obs);
      INFO("case " << c << " step " << s << " ring " << ring << " keys " << keys);
      CHECK(obs.collisions.same_step == same);
      CHECK(obs.collisions.outside_block == outside);
      CHECK(obs.collisions.replaced_needed == replaced);
      REQUIRE(obs.queries.size() == static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        const QueryObservation& q = obs.queries[static_cast<std::size_t>(i)];
        const Expect& e = expect[static_cast<std::size_t>(i)];
        const auto lost = static_cast<std::int64_t>(q.overwritten.size() + q.missing.size());
        CHECK(lost == e.lost);
        CHECK(static_cast<std::int64_t>(q.extra.size()) ==
              e.extra - static_cast<std::int64_t>(q.overwritten.size()));
        std::set<std::int64_t> lost_set(q.overwritten.begin(), q.overwritten.end());
        lost_set.insert(q.missing.begin(), q.missing.end());
        for (const std::int64_t j : e.must_lose) CHECK(lost_set.count(j) == 1);
        extra_seen += static_cast<std::int64_t>(q.extra.size());
        stale_seen += static_cast<std::int64_t>(q.overwritten.size());
        lost_seen += lost;
      }
      outside_seen += outside;
      same_seen += same;
      length[static_cast<std::size_t>(r)] = first + n;
    }
  }
  // Every kind of finding occurred (the model judged something).
  CHECK(extra_seen > 100);
  CHECK(stale_seen > 50);
  CHECK(lost_seen > 100);
  CHECK(outside_seen > 50);
  CHECK(same_seen > 10);
}

TEST_CASE(
    "Judge: the verdict fails exactly the runs with a lost or extra read, a collision, a bad row or output") {
  Prng rng(31);
  int failing = 0;
  for (int c = 0; c < 2000; ++c) {
    RunObservation run;
    bool should_fail = false;
    const int steps = 1 + static_cast<int>(rng.below(4));
    for (int s = 0; s < steps; ++s) {
      StepObservation obs;
      obs.step = s;
      obs.kind = "decode";
      const int queries = 1 + static_cast<int>(rng.below(3));
      for (int i = 0; i < queries; ++i) {
        QueryObservation q;
        q.position = i;
        const std::uint64_t roll = rng.below(40);
        if (roll == 0) q.overwritten.push_back(0);
        if (roll == 1) q.missing.push_back(0);
        if (roll == 2) q.extra.push_back(ReadTag{5, 1, 0, 1});
        if (roll == 3) q.output_ok = false;
        q.output_checked = roll > 3;
        should_fail = should_fail || roll <= 3;
        obs.queries.push_back(q);
      }
      const std::uint64_t roll = rng.below(60);
      if (roll == 0) obs.collisions.same_step = 1;
      if (roll == 1) obs.collisions.outside_block = 1;
      if (roll == 2) obs.collisions.replaced_needed = 1;
      if (roll == 3) obs.encoding_mismatches = 1;
      if (roll == 4) obs.error = "refused";
      should_fail = should_fail || roll <= 4;
      run.steps.push_back(obs);
    }
    judge_run(scenarios::Scenario{}, &run);
    INFO("case " << c);
    CHECK(run.passed == !should_fail);
    CHECK((run.first_failing_step >= 0) == should_fail);
    failing += should_fail ? 1 : 0;
  }
  CHECK(failing > 300);
  CHECK(failing < 1700);
}
