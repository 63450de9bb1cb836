// The decode path allocates nothing: every buffer is sized when the pool is
// created. This executable replaces the global operator new with a counting
// one, so it is its own test binary.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "impl/ring_pool.hpp"
#include "support/prng.hpp"

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

// Every unaligned form is replaced, so a pointer from any of them is freed by
// its matching delete (AddressSanitizer checks new/delete pairs).
void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  return operator new(size);
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

using namespace kvcheck::impl;

TEST_CASE("RingPool: decode, verify, accept and prefill allocate nothing after create") {
  for (const auto format :
       {ElementFormat::kF64, ElementFormat::kF32, ElementFormat::kBf16, ElementFormat::kFp8}) {
    for (const bool track : {false, true}) {
      INFO("format " << static_cast<int>(format) << " tags " << track);
      PoolSpec spec;
      spec.states = 2;
      spec.ring_rows = 70;
      spec.window_keys = 64;
      spec.q_heads = 8;
      spec.kv_heads = 2;
      spec.head_dim = 128;
      spec.format = format;
      spec.rope_style = RopeStyle::kNeox;
      spec.rope_dims = 64;
      spec.max_step_rows = 6;
      spec.track_tags = track;
      std::unique_ptr<RingPool> pool;
      REQUIRE(RingPool::create(make_backend("cpu", nullptr), spec, &pool).ok());
      REQUIRE(pool->begin(1, 7).ok());
      const std::int64_t kv = 2 * 128, q = 8 * 128, rows = 6;
      std::vector<double> k(static_cast<std::size_t>(rows * kv)), v(k.size()),
          qs(static_cast<std::size_t>(rows * q));
      kvcheck::Prng rng(3);
      for (auto* buf : {&k, &v, &qs}) {
        for (double& x : *buf) x = rng.signed_unit();
      }
      const StepRows in{k.data(), v.data(), qs.data()};
      StepResult result;
      // Warm up past one wrap so every branch (wrap, padding) has run once.
      for (int i = 0; i < 80; ++i) REQUIRE(pool->decode(1, in, &result).ok());
      const long before = g_allocations.load();
      for (int i = 0; i < 50; ++i) REQUIRE(pool->decode(1, in, &result).ok());
      REQUIRE(pool->verify(1, 5, in, &result).ok());
      REQUIRE(pool->accept(1, 2).ok());
      REQUIRE(pool->prefill(1, 6, in, PrefillOrder::kLoadThenStore, &result).ok());
      REQUIRE(pool->prefill(1, 6, in, PrefillOrder::kStoreThenLoad, &result).ok());
      CHECK(g_allocations.load() - before == 0);
      CHECK(result.queries == 6);
      // Control: the counter does see an allocation.
      const long control = g_allocations.load();
      auto probe = std::make_unique<std::vector<int>>(10);
      CHECK(g_allocations.load() - control >= 1);
    }
  }
}
