// CpuBackend kernel tests beyond the conformance suite: the golden ring trace
// through the ring slot map, a block table through the same kernels,
// same-step collisions, names of faults, formats and errors, and the factory.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "impl/block_table.hpp"
#include "impl/cpu/cpu_backend.hpp"
#include "impl/kv_cache.hpp"
#include "impl/ring_pool.hpp"
#include "impl/row_codec.hpp"
#include "impl/slot_map.hpp"
#include "model/address.hpp"

using namespace kvcheck::impl;
namespace model = kvcheck::model;

TEST_CASE("SlotMap: the golden ring trace W = 128, S = 134 through the ring slot map") {
  const SlotMap map = ring_slot_map(4, 134, Fault::kNone);
  CHECK(map.pool_slots == 4 * 134);
  struct Row {
    std::int64_t state, p, first, last, write;
  };
  const Row rows[] = {{2, 127, 268, 395, 395},
                      {2, 128, 269, 396, 396},
                      {2, 133, 274, 401, 401},
                      {2, 134, 275, 268, 268},
                      {3, 134, 409, 402, 402}};
  const model::Ring ring{4, 134, 128};
  for (const auto& r : rows) {
    const std::int64_t len = std::min<std::int64_t>(r.p + 1, 128);
    std::vector<std::int64_t> index(128);
    slot_map_index_row(map, r.state, r.p - len + 1, len, 128, index.data());
    CHECK(slot_map_slot(map, r.state, r.p) == r.write);
    CHECK(index.front() == r.first);
    CHECK(index.back() == r.last);
    CHECK(index == model::expand_index(r.state, r.p, ring, 128));
  }
  std::vector<std::int64_t> index(128);
  slot_map_index_row(map, 1, 0, 4, 128, index.data());
  CHECK(index == model::expand_index(1, 3, ring, 128));
  CHECK(index[4] == -1);
  // The address faults live in the ring's map: the state offset dropped, the
  // last state's wrap taken modulo the whole pool (into state 0's block).
  CHECK(slot_map_slot(ring_slot_map(4, 134, Fault::kSlotNoStateOffset), 2, 140) == 6);
  CHECK(slot_map_slot(map, 3, 134) == 402);
  CHECK(slot_map_slot(ring_slot_map(4, 134, Fault::kModuloWholePool), 3, 134) == 0);
}

TEST_CASE("RingPool: a block table runs the same kernels and steps as the ring, with the same outputs") {
  // W = 5, 3 blocks of 3 rows per state (S = 9 >= W + 3 drafts), 5 blocks for
  // 2 states: the second request's third block waits for the first's finish.
  PoolSpec spec;
  spec.states = 2;
  spec.window_keys = 5;
  spec.ring_rows = 9;
  spec.q_heads = 2;
  spec.head_dim = 4;
  spec.max_step_rows = 4;
  spec.format = ElementFormat::kBf16;
  spec.rope_style = RopeStyle::kNeox;
  spec.rope_dims = 4;
  std::unique_ptr<RingPool> ring, paged;
  REQUIRE(RingPool::create(make_backend("cpu", nullptr), spec, &ring).ok());
  PoolSpec paged_spec = spec;
  paged_spec.pool_slots = 5 * 3;
  std::unique_ptr<BlockTable> table;
  REQUIRE(BlockTable::create(2, 3, 3, 5, &table).ok());
  const BlockTable* blocks = table.get();
  REQUIRE(RingPool::create(make_backend("cpu", nullptr), paged_spec, std::move(table), &paged).ok());
  CHECK(paged->slot_map().kind == SlotMapKind::kBlockTable);
  std::vector<double> rows(40);  // k, v, q of 4 rows at offsets 0, 3, 1
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = std::sin(0.7 * static_cast<double>(i) + 0.1);
  const StepRows in{rows.data(), rows.data() + 3, rows.data() + 1};
  // Each step on both pools: outputs bit for bit, and the tags each query read.
  auto same = [&](auto&& step) {
    StepResult a, b;
    REQUIRE(step(*ring, &a).ok());
    REQUIRE(step(*paged, &b).ok());
    REQUIRE(a.out.size() == b.out.size());
    for (std::size_t i = 0; i < a.out.size(); ++i) REQUIRE(a.out[i] == b.out[i]);
    REQUIRE(a.read_tags.size() == b.read_tags.size());
    for (std::size_t i = 0; i < a.read_tags.size(); ++i) REQUIRE(a.read_tags[i] == b.read_tags[i]);
    return b;
  };
  for (auto* p : {ring.get(), paged.get()}) REQUIRE(p->begin(0, 10).ok());
  same([&](RingPool& p, StepResult* r) { return p.prefill(0, 4, in, PrefillOrder::kLoadThenStore, r); });
  same([&](RingPool& p, StepResult* r) { return p.prefill(0, 3, in, PrefillOrder::kStoreThenLoad, r); });
  const StepResult v = same([&](RingPool& p, StepResult* r) { return p.verify(0, 3, in, r); });
  // The block table's slots are not the ring's: the map, not the kernels, placed them.
  bool moved = false;
  for (const auto& w : v.writes) moved = moved || w.slot != w.written.position % 9;
  CHECK(moved);
  for (auto* p : {ring.get(), paged.get()}) REQUIRE(p->accept(0, 1).ok());
  for (int i = 0; i < 6; ++i) same([&](RingPool& p, StepResult* r) { return p.decode(0, in, r); });
  // State 0 holds 3 blocks, state 1 takes 2; its third must wait for state 0's finish.
  for (auto* p : {ring.get(), paged.get()}) REQUIRE(p->begin(1, 11).ok());
  same([&](RingPool& p, StepResult* r) { return p.prefill(1, 4, in, PrefillOrder::kLoadThenStore, r); });
  same([&](RingPool& p, StepResult* r) { return p.prefill(1, 2, in, PrefillOrder::kStoreThenLoad, r); });
  StepResult refused;
  CHECK(blocks->free_blocks() == 0);
  CHECK(paged->decode(1, in, &refused).code == CacheError::kAllocation);
  CHECK(paged->state(1).length == 6);
  CHECK(blocks->free_blocks() == 0);
  for (auto* p : {ring.get(), paged.get()}) REQUIRE(p->finish(0).ok());
  CHECK(blocks->free_blocks() == 3);
  same([&](RingPool& p, StepResult* r) { return p.decode(1, in, r); });
  CHECK(blocks->free_blocks() == 2);
  // A map that does not match the spec's pool is refused.
  std::unique_ptr<RingPool> bad;
  REQUIRE(BlockTable::create(2, 3, 3, 5, &table).ok());
  CHECK(RingPool::create(make_backend("cpu", nullptr), spec, std::move(table), &bad).code ==
        CacheError::kBadSpec);
  CHECK(BlockTable::create(2, 0, 3, 5, &table).code == CacheError::kZeroRing);
}

TEST_CASE("CpuBackend: store reports same-step write-write collisions") {
  cpu::CpuBackend b;
  PoolSpec spec;
  spec.states = 2;
  spec.window_keys = 4;
  spec.ring_rows = 4;
  spec.head_dim = 2;
  spec.max_step_rows = 6;
  REQUIRE(b.configure(spec).ok());
  std::vector<double> k(12, 1.0), v(12, 2.0);
  std::vector<std::int64_t> slots = {0, 1, 0, 5, 1, 0};
  std::vector<std::int64_t> pos = {0, 1, 4, 1, 5, 8};
  std::vector<Tag> tags(6);
  for (std::size_t i = 0; i < 6; ++i) tags[i] = Tag{1, pos[i], i + 1};
  StoreReport report;
  REQUIRE(b.store(slots, pos, k.data(), v.data(), tags, &report).ok());
  CHECK(report.duplicate_slots == 2);  // slots 0 (three writes) and 1 (two)
  CHECK(b.slot_tag(0) == tags[5]);     // the last write wins on the CPU
  REQUIRE(b.store({slots.data(), 2}, {pos.data(), 2}, k.data(), v.data(), {tags.data(), 2}, &report).ok());
  CHECK(report.duplicate_slots == 0);
  // A refused store (slot outside the pool) changes no byte.
  const std::vector<std::uint8_t> before(b.pool_bytes().begin(), b.pool_bytes().end());
  std::vector<std::int64_t> bad = {3, 8};
  CHECK(b.store(bad, {pos.data(), 2}, k.data(), v.data(), {tags.data(), 2}, &report).code ==
        CacheError::kSlotOutOfRange);
  // A broken call (tags for one row of two) is the caller's defect, not bad data.
  CHECK(b.store({slots.data(), 2}, {pos.data(), 2}, k.data(), v.data(), {tags.data(), 1}, &report).code ==
        CacheError::kBadArgument);
  CHECK(b.store({slots.data(), 2}, {pos.data(), 2}, nullptr, v.data(), {tags.data(), 2}, &report).code ==
        CacheError::kBadArgument);
  CHECK(std::vector<std::uint8_t>(b.pool_bytes().begin(), b.pool_bytes().end()) == before);
}

TEST_CASE("CpuBackend: a stored row takes the format table's row bytes in the pool, for every format") {
  // The encoder writes exactly format_row_bytes bytes (fp8: a scale byte for
  // every block begun, the last one short), and the pool lays the key and
  // value rows of a slot end to end at that size: a floor(n / 32) scale
  // count would cut the last block's scale off rows of 33 or 70 elements.
  for (const ElementFormat f : kvcheck::kElementFormats) {
    for (const std::int32_t n : {1, 31, 32, 33, 70}) {
      INFO(format_name(f) << " row of " << n);
      const std::int64_t row_bytes = format_row_bytes(f, n);
      std::vector<double> k(static_cast<std::size_t>(n)), v(k.size());
      for (std::int32_t i = 0; i < n; ++i) {
        k[static_cast<std::size_t>(i)] = 0.75 + 0.01 * i;
        v[static_cast<std::size_t>(i)] = -0.5 - 0.02 * i;
      }
      constexpr std::uint8_t kUnwritten = 0xA5;
      std::vector<std::uint8_t> key(static_cast<std::size_t>(row_bytes) + 8, kUnwritten), value(key);
      encode_row(f, k.data(), n, key.data());
      encode_row(f, v.data(), n, value.data());
      CHECK(key[static_cast<std::size_t>(row_bytes) - 1] != kUnwritten);  // the row's last byte is its own
      CHECK(std::vector<std::uint8_t>(key.begin() + row_bytes, key.end()) ==
            std::vector<std::uint8_t>(8, kUnwritten));  // and nothing past it
      cpu::CpuBackend b;
      PoolSpec spec;
      spec.format = f;
      spec.states = 1;
      spec.window_keys = 2;
      spec.ring_rows = 2;
      spec.head_dim = n;
      spec.max_step_rows = 1;
      REQUIRE(b.configure(spec).ok());
      CHECK(b.slot_bytes() == 2 * row_bytes);
      const std::int64_t slot = 1, position = 0;
      const Tag tag{1, position, 1};
      REQUIRE(b.store({&slot, 1}, {&position, 1}, k.data(), v.data(), {&tag, 1}, nullptr).ok());
      const auto pool = b.pool_bytes();
      const auto at = pool.begin() + b.slot_stride();
      CHECK(std::vector<std::uint8_t>(at, at + row_bytes) ==
            std::vector<std::uint8_t>(key.begin(), key.begin() + row_bytes));
      CHECK(std::vector<std::uint8_t>(at + row_bytes, at + 2 * row_bytes) ==
            std::vector<std::uint8_t>(value.begin(), value.begin() + row_bytes));
    }
  }
}

TEST_CASE("CpuBackend: names of faults, formats and errors are unique and parse back") {
  std::set<std::string> names;
  for (int i = 0; i < kFaultCount; ++i) {
    const auto f = static_cast<Fault>(i);
    const std::string name(fault_name(f));
    CHECK(names.insert(name).second);
    CHECK(name != "?");
    CHECK(!fault_description(f).empty());
    Fault back = Fault::kNone;
    CHECK(parse_fault(name, &back));
    CHECK(back == f);
  }
  Fault f = Fault::kNone;
  CHECK(!parse_fault("no-such-fault", &f));
  CHECK(fault_name(Fault::kRingSizedWindow) == "ring-sized-window");
  CHECK(format_name(ElementFormat::kFp8) == "fp8");
  CHECK(cache_error_name(CacheError::kStateOutOfRange) == "state-out-of-range");
  std::set<std::string> errors;
  for (int e = 0; e <= static_cast<int>(CacheError::kBadArgument); ++e) {
    const std::string name(cache_error_name(static_cast<CacheError>(e)));
    CHECK(name != "?");
    CHECK(errors.insert(name).second);
  }
  std::string why;
  CHECK(make_backend("tpu", &why) == nullptr);
  CHECK(why.find("tpu") != std::string::npos);
}

TEST_CASE("CpuBackend: the ring-sized-window fault allocates exactly W rows") {
  PoolSpec spec;
  spec.states = 2;
  spec.window_keys = 6;
  spec.ring_rows = 9;
  spec.fault = Fault::kRingSizedWindow;
  std::unique_ptr<RingPool> pool;
  REQUIRE(RingPool::create(make_backend("cpu", nullptr), spec, &pool).ok());
  CHECK(pool->spec().ring_rows == 6);
}

namespace {

/// The CPU backend with a device that breaks on the n-th attend: what a CUDA
/// backend returns when a kernel launch or copy fails mid-step.
class FailingAttend final : public KvBackend {
 public:
  explicit FailingAttend(int fail_at) : fail_at_(fail_at) {}
  std::string_view name() const noexcept override { return "failing"; }
  bool supports(const PoolSpec& s, std::string* why) const override { return cpu_.supports(s, why); }
  Status configure(const PoolSpec& s) override { return cpu_.configure(s); }
  Status store(std::span<const std::int64_t> s, std::span<const std::int64_t> p, const double* k,
               const double* v, std::span<const Tag> t, StoreReport* r) override {
    return cpu_.store(s, p, k, v, t, r);
  }
  Status load(std::span<const std::int64_t> i, std::int64_t f) override { return cpu_.load(i, f); }
  Status scratch_store(std::int64_t f, std::span<const std::int64_t> o, std::span<const std::int64_t> p,
                       const double* k, const double* v, std::span<const Tag> t) override {
    return cpu_.scratch_store(f, o, p, k, v, t);
  }
  Status attend(KvSource src, std::span<const std::int64_t> p, const double* q,
                std::span<const std::int64_t> i, std::int64_t w, double* out, Tag* rt,
                std::int64_t* rs) override {
    if (++calls_ == fail_at_) return Status::fail(CacheError::kDeviceFailure, "attend: launch failed");
    return cpu_.attend(src, p, q, i, w, out, rt, rs);
  }
  Tag slot_tag(std::int64_t slot) const override { return cpu_.slot_tag(slot); }
  Status read_row(std::int64_t slot, double* k, double* v) const override {
    return cpu_.read_row(slot, k, v);
  }

 private:
  cpu::CpuBackend cpu_;
  int fail_at_;
  int calls_ = 0;
};

}  // namespace

TEST_CASE("RingPool: a device failure after the store is returned, not an abort, and the length goes back") {
  PoolSpec spec;
  spec.states = 1;
  spec.window_keys = 4;
  spec.ring_rows = 6;
  spec.head_dim = 2;
  spec.max_step_rows = 3;
  std::unique_ptr<RingPool> pool;
  REQUIRE(RingPool::create(std::make_unique<FailingAttend>(2), spec, &pool).ok());
  REQUIRE(pool->begin(0, 7).ok());
  std::vector<double> rows(6, 0.5);
  StepRows in{rows.data(), rows.data(), rows.data()};
  StepResult r;
  REQUIRE(pool->decode(0, in, &r).ok());
  const Status failed = pool->decode(0, in, &r);
  CHECK(failed.code == CacheError::kDeviceFailure);
  CHECK(failed.detail.find("reset the state") != std::string::npos);
  CHECK(pool->state(0).length == 1);
  // Both prefill orders and verify fail the same way on the next failures.
  std::unique_ptr<RingPool> again;
  REQUIRE(RingPool::create(std::make_unique<FailingAttend>(1), spec, &again).ok());
  REQUIRE(again->begin(0, 7).ok());
  CHECK(again->verify(0, 1, in, &r).code == CacheError::kDeviceFailure);
  CHECK(again->state(0).length == 0);
  CHECK(again->state(0).pending_drafts == -1);
  for (const auto order : {PrefillOrder::kLoadThenStore, PrefillOrder::kStoreThenLoad}) {
    std::unique_ptr<RingPool> p;
    REQUIRE(RingPool::create(std::make_unique<FailingAttend>(1), spec, &p).ok());
    REQUIRE(p->begin(0, 7).ok());
    CHECK(p->prefill(0, 2, in, order, &r).code == CacheError::kDeviceFailure);
    CHECK(p->state(0).length == 0);
  }
}

TEST_CASE("RingPool: a step's readers get what a full step gives them, the other queries only store") {
  PoolSpec spec;
  spec.states = 1;
  spec.window_keys = 5;
  spec.ring_rows = 7;
  spec.q_heads = 2;
  spec.head_dim = 2;
  spec.max_step_rows = 6;
  // all: every query reads; some: the readers, with outputs; tags: the
  // readers without outputs, read buffers for 3 of them.
  std::unique_ptr<RingPool> all, some, tags;
  REQUIRE(RingPool::create(make_backend("cpu", nullptr), spec, &all).ok());
  REQUIRE(RingPool::create(make_backend("cpu", nullptr), spec, &some).ok());
  PoolSpec three = spec;
  three.max_step_readers = 3;
  REQUIRE(RingPool::create(make_backend("cpu", nullptr), three, &tags).ok());
  for (RingPool* pool : {all.get(), some.get(), tags.get()}) REQUIRE(pool->begin(0, 3).ok());
  // [6, heads 2, dim 2] rows of k, v and q, each step its own values.
  std::vector<double> k(24), v(24), q(24);
  struct Case {
    int kind;  // 0 prefill load_then_store, 1 prefill store_then_load, 2 decode, 3 verify(3) + accept(1)
    std::int64_t rows;
    std::vector<std::int64_t> readers;
  };
  const Case cases[] = {{0, 4, {0, 3}}, {1, 6, {1, 2, 5}}, {2, 1, {}},  {3, 4, {0, 3}},
                        {0, 5, {}},     {1, 3, {0}},       {2, 1, {0}}, {0, 6, {2, 4, 5}}};
  double x = 0.25;
  for (const Case& c : cases) {
    for (auto* rows : {&k, &v, &q}) {
      for (auto& e : *rows) e = x = std::fmod(x * 3.7 + 0.31, 2.0) - 1.0;
    }
    const StepRows in{k.data(), v.data(), q.data()};
    auto run = [&](RingPool& pool, const StepReads& reads, StepResult* r) {
      switch (c.kind) {
        case 0: return pool.prefill(0, c.rows, in, PrefillOrder::kLoadThenStore, r, reads);
        case 1: return pool.prefill(0, c.rows, in, PrefillOrder::kStoreThenLoad, r, reads);
        case 2: return pool.decode(0, in, r, reads);
        default: {
          Status st = pool.verify(0, c.rows - 1, in, r, reads);
          return st.ok() ? pool.accept(0, 1) : st;
        }
      }
    };
    INFO("case kind " << c.kind << ", " << c.rows << " rows, " << c.readers.size() << " readers");
    const std::span<const std::int64_t> readers(c.readers);
    StepResult a, results[2];
    REQUIRE(run(*all, StepReads{}, &a).ok());
    REQUIRE(run(*some, StepReads{readers, true}, &results[0]).ok());
    REQUIRE(run(*tags, StepReads{readers, false}, &results[1]).ok());
    CHECK(a.readers == c.rows);
    const auto q_elements = static_cast<std::size_t>(spec.q_heads * spec.head_dim);
    const auto width = static_cast<std::size_t>(a.width);
    for (const StepResult& s : results) {
      CHECK(s.readers == static_cast<std::int64_t>(c.readers.size()));
      CHECK(s.queries == a.queries);
      CHECK(s.duplicate_slots == a.duplicate_slots);
      REQUIRE(s.writes.size() == a.writes.size());
      for (std::size_t w = 0; w < a.writes.size(); ++w) {
        CHECK(s.writes[w].slot == a.writes[w].slot);
        CHECK(s.writes[w].written == a.writes[w].written);
        CHECK(s.writes[w].replaced == a.writes[w].replaced);
      }
      REQUIRE(s.read_slots.size() == c.readers.size() * width);
      for (std::size_t r = 0; r < c.readers.size(); ++r) {
        const auto i = static_cast<std::size_t>(c.readers[r]);
        for (std::size_t col = 0; col < width; ++col) {
          CHECK(s.read_slots[r * width + col] == a.read_slots[i * width + col]);
          CHECK(s.read_tags[r * width + col] == a.read_tags[i * width + col]);
        }
      }
    }
    // Outputs only where asked for, the readers' rows bit for bit.
    CHECK(results[1].out.empty());
    REQUIRE(results[0].out.size() == c.readers.size() * q_elements);
    for (std::size_t r = 0; r < c.readers.size(); ++r) {
      const auto i = static_cast<std::size_t>(c.readers[r]);
      for (std::size_t e = 0; e < q_elements; ++e)
        CHECK(results[0].out[r * q_elements + e] == a.out[i * q_elements + e]);
    }
    CHECK(some->state(0).length == all->state(0).length);
    CHECK(tags->state(0).length == all->state(0).length);
  }
  for (std::int64_t slot = 0; slot < spec.ring_rows; ++slot) {
    CHECK(some->backend().slot_tag(slot) == all->backend().slot_tag(slot));
    CHECK(tags->backend().slot_tag(slot) == all->backend().slot_tag(slot));
  }
  // Readers out of order, repeated or past the step's rows, or more than the
  // pool's max_step_readers (every query of a 4-row step included), are
  // refused before any write.
  const std::int64_t length = tags->state(0).length;
  const std::vector<std::int64_t> bad[] = {{2, 1}, {1, 1}, {0, 3}, {-1}};
  for (const auto& readers : bad) {
    const StepRows in{k.data(), v.data(), q.data()};
    StepResult r;
    CHECK(tags->prefill(0, 3, in, PrefillOrder::kStoreThenLoad, &r, StepReads{readers, false}).code ==
          CacheError::kBadArgument);
  }
  const std::vector<std::int64_t> four = {0, 1, 2, 3};
  StepResult r;
  const StepRows in{k.data(), v.data(), q.data()};
  CHECK(tags->prefill(0, 4, in, PrefillOrder::kStoreThenLoad, &r, StepReads{four, false}).code ==
        CacheError::kTooManyRows);
  CHECK(tags->verify(0, 3, in, &r).code == CacheError::kTooManyRows);
  CHECK(tags->state(0).length == length);
  for (std::int64_t slot = 0; slot < spec.ring_rows; ++slot)
    CHECK(tags->backend().slot_tag(slot) == all->backend().slot_tag(slot));
  // A pool spec's readers lie in [0, max_step_rows].
  std::unique_ptr<RingPool> none;
  three.max_step_readers = 7;
  CHECK(RingPool::create(make_backend("cpu", nullptr), three, &none).code == CacheError::kBadSpec);
  three.max_step_readers = -1;
  CHECK(RingPool::create(make_backend("cpu", nullptr), three, &none).code == CacheError::kBadSpec);
}
