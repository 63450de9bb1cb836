// What the ring pool declares for each backend (engines/ring_pool_cache.hpp),
// without a device: the CUDA pool's shapes, step kinds and features, its
// kernel paths as a backend answers them (a stand-in backend here: the CUDA
// one needs a device to exist), and the typed error of `--impl cuda` where
// there is no device.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "engines/factory.hpp"
#include "engines/ring_pool_cache.hpp"
#include "impl/kv_cache.hpp"
#include "support/error.hpp"

namespace {

namespace impl = kvcheck::impl;
using kvcheck::engines::CacheSpec;
using kvcheck::engines::Capabilities;

/// A kernel table that only answers its kernel paths: "wide" for a pool
/// whose window is past 100 keys, "batch" for a step of more than 4 queries.
/// It remembers the windows it was asked about.
class PathsOnlyBackend final : public impl::KvBackend {
 public:
  std::string_view name() const noexcept override { return "paths-only"; }
  bool supports(const impl::PoolSpec&, std::string*) const override { return false; }
  impl::Status configure(const impl::PoolSpec&) override { return refused(); }
  impl::Status store(std::span<const std::int64_t>, std::span<const std::int64_t>, const double*,
                     const double*, std::span<const impl::Tag>, impl::StoreReport*) override {
    return refused();
  }
  impl::Status load(std::span<const std::int64_t>, std::int64_t) override { return refused(); }
  impl::Status scratch_store(std::int64_t, std::span<const std::int64_t>, std::span<const std::int64_t>,
                             const double*, const double*, std::span<const impl::Tag>) override {
    return refused();
  }
  impl::Status attend(impl::KvSource, std::span<const std::int64_t>, const double*,
                      std::span<const std::int64_t>, std::int64_t, double*, impl::Tag*,
                      std::int64_t*) override {
    return refused();
  }
  impl::Tag slot_tag(std::int64_t) const override { return {}; }
  impl::Status read_row(std::int64_t, double*, double*) const override { return refused(); }
  std::vector<std::string> attend_paths() const override { return {"wide", "batch"}; }
  std::vector<bool> attend_paths_run(const impl::PoolSpec& spec,
                                     std::span<const std::int64_t> step_queries) const override {
    windows->push_back(spec.window_keys);
    bool batch = false;
    for (const std::int64_t n : step_queries) batch = batch || n > 4;
    return {spec.window_keys > 100, batch};
  }
  std::shared_ptr<std::vector<std::int64_t>> windows = std::make_shared<std::vector<std::int64_t>>();

 private:
  static impl::Status refused() { return impl::Status::fail(impl::CacheError::kUnsupported, "paths only"); }
};

CacheSpec two_layers(std::int64_t first_window, std::int64_t second_window) {
  CacheSpec spec;
  spec.cache.layers = 2;
  spec.cache.ring_rows = 300;
  spec.cache.head_dim = 8;
  spec.window_keys = first_window;
  spec.layer_window_keys = {first_window, second_window};
  spec.max_step_rows = 8;
  return spec;
}

}  // namespace

TEST_CASE(
    "RingPool capabilities: --impl cuda declares RingPool's steps and features and the kernels' head_dim",
    "[engines][cuda]") {
  const Capabilities cuda = kvcheck::engines::ring_pool_capabilities("cuda", impl::Fault::kNone, 0, nullptr);
  const Capabilities cpu = kvcheck::engines::ring_pool_capabilities("cpu", impl::Fault::kNone, 0, nullptr);
  CHECK(cuda.name == "ring-pool/cuda");
  // The step kinds are RingPool's, composed once for every backend: trim included.
  CHECK(cuda.trim);
  CHECK(cuda.verify);
  CHECK(cuda.prefill_load_then_store);
  CHECK(cuda.prefill_store_then_load);
  CHECK(cuda.per_layer_windows);
  CHECK(cuda.ring_addressing);
  CHECK(cuda.block_size == 0);
  CHECK_FALSE(cuda.prefix_sharing);
  CHECK(cuda.probes == cpu.probes);
  // The CUDA attention kernels stop at head_dim 512; the CPU pool has no such limit.
  CHECK(cuda.head_dims.contains(512));
  CHECK_FALSE(cuda.head_dims.contains(513));
  CHECK(cpu.head_dims.contains(513));
  std::string why;
  kvcheck::scenarios::CacheConfig c;
  c.head_dim = 640;
  CHECK_FALSE(cuda.supports(c, 1, &why));
  CHECK(why.find("head_dim 640") != std::string::npos);
  // No backend to ask: no kernel paths, no classes.
  CHECK(cuda.kernel_paths.empty());
  CHECK_FALSE(cuda.kernel_paths_run);
}

TEST_CASE("RingPool capabilities: kernel paths are the backend's, over every layer's own window",
          "[engines][cuda]") {
  auto backend = std::make_shared<PathsOnlyBackend>();
  const auto windows = backend->windows;
  const Capabilities caps =
      kvcheck::engines::ring_pool_capabilities("cuda", impl::Fault::kWindowTooWide, 0, backend);
  REQUIRE(caps.kernel_paths == std::vector<std::string>{"wide", "batch"});
  REQUIRE(caps.kernel_paths_run);
  const std::vector<std::int64_t> decode = {1, 1}, verify = {1, 5};
  // Layer 1's window reaches past 100 keys: the pool of layer 0 alone would not.
  CHECK(caps.kernel_paths_run(two_layers(50, 200), decode) == std::vector<bool>{true, false});
  CHECK(*windows == std::vector<std::int64_t>{50, 200});
  CHECK(caps.kernel_paths_run(two_layers(50, 60), verify) == std::vector<bool>{false, true});
  // A global layer reads what its ring and a step hold, no more: 300 + 8.
  windows->clear();
  (void)caps.kernel_paths_run(two_layers(50, kvcheck::scenarios::kGlobalWindowKeys), decode);
  CHECK(*windows == std::vector<std::int64_t>{50, 308});
}

TEST_CASE("RingPool provider: --impl cuda without a device is a typed device error, with a device 4 classes",
          "[engines][cuda]") {
  std::string why;
  if (impl::make_backend("cuda", &why)) {
    // A device (or a build) that runs CUDA: the pool declares its dispatch classes.
    const auto provider = kvcheck::engines::make_provider("cuda", "none", {});
    CHECK(provider->capabilities().kernel_paths.size() == 4);
    return;
  }
  INFO(why);
  CHECK_FALSE(why.empty());
  try {
    (void)kvcheck::engines::make_provider("cuda", "none", {});
    FAIL("--impl cuda made a provider with no CUDA backend to run");
  } catch (const kvcheck::Error& e) {
    CHECK(e.id() == kvcheck::ErrorId::kDevice);
    CHECK(std::string(e.what()).find(why) != std::string::npos);
  }
}
