// CpuBackend kernel tests beyond the conformance suite: SPEC §6 ring trace
// through the metadata kernel, same-step collisions, names of faults,
// formats and errors, and the factory.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "impl/cpu/cpu_backend.hpp"
#include "impl/kv_cache.hpp"
#include "impl/ring_pool.hpp"
#include "impl/row_codec.hpp"
#include "model/address.hpp"

using namespace kvcheck::impl;
namespace model = kvcheck::model;

TEST_CASE("CpuBackend: SPEC ring trace W = 128, S = 134 through metadata and index kernels") {
  auto b = make_backend("cpu", nullptr);
  REQUIRE(b);
  PoolSpec spec;
  spec.states = 4;
  spec.window_keys = 128;
  spec.ring_rows = 134;
  REQUIRE(b->configure(spec).ok());
  struct Row {
    std::int64_t state, p, first, last, write;
  };
  const Row rows[] = {{2, 127, 268, 395, 395},
                      {2, 128, 269, 396, 396},
                      {2, 133, 274, 401, 401},
                      {2, 134, 275, 268, 268},
                      {3, 134, 409, 402, 402}};
  for (const auto& r : rows) {
    QueryRef q{r.state, r.p};
    ReadMeta m;
    REQUIRE(b->metadata({&q, 1}, {&m, 1}).ok());
    std::vector<std::int64_t> index(128);
    REQUIRE(b->expand_index({&m, 1}, 128, index).ok());
    CHECK(m.read_offset == r.first);
    CHECK(m.write_slot == r.write);
    CHECK(index.front() == r.first);
    CHECK(index.back() == r.last);
    const model::Ring ring{4, 134, 128};
    CHECK(index == model::expand_index(r.state, r.p, ring, 128));
  }
  QueryRef early{1, 3};
  ReadMeta m;
  REQUIRE(b->metadata({&early, 1}, {&m, 1}).ok());
  std::vector<std::int64_t> index(128);
  REQUIRE(b->expand_index({&m, 1}, 128, index).ok());
  CHECK(index == model::expand_index(1, 3, model::Ring{4, 134, 128}, 128));
  CHECK(index[4] == -1);
  QueryRef bad{4, 0};
  CHECK(b->metadata({&bad, 1}, {&m, 1}).code == CacheError::kStateOutOfRange);
  bad = {0, -1};
  CHECK(b->metadata({&bad, 1}, {&m, 1}).code == CacheError::kNegativePosition);
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
  Status metadata(std::span<const QueryRef> q, std::span<ReadMeta> o) override { return cpu_.metadata(q, o); }
  Status expand_index(std::span<const ReadMeta> m, std::int64_t w, std::span<std::int64_t> i) override {
    return cpu_.expand_index(m, w, i);
  }
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
