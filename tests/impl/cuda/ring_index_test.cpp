// The ring index math of impl/ring_index.hpp is shared by the CPU backend and
// the CUDA kernels. These tests run on any machine: they compare the functions
// as nvcc compiled them (a host function in ring_index_probe.cu) with the same
// functions compiled by the host C++ compiler, and both with the model's
// independent address oracle (model/address.hpp). A device, when present,
// is compared too; without one that case reports itself skipped by name.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "impl/cuda/cuda_backend.hpp"
#include "impl/ring_index.hpp"
#include "model/address.hpp"
#include "tests/impl/cuda/ring_index_probe.hpp"

namespace {

using kvcheck::impl::Fault;
using kvcheck::impl::ReadMeta;
using kvcheck::impl::cuda_test::ProbeCase;
using kvcheck::impl::cuda_test::ProbeResult;

constexpr std::int64_t kWidth = 12;

/// Faults that leave the address math alone (the model must agree with them).
bool address_fault_free(Fault f) {
  return f != Fault::kWindowTooWide && f != Fault::kWindowTooNarrow && f != Fault::kIndexNoPadding &&
         f != Fault::kSlotNoStateOffset && f != Fault::kModuloWholePool;
}

/// Sizes chosen to break things: 1, 2, 3, 7, primes, exact wraps.
std::vector<ProbeCase> probe_grid() {
  std::vector<ProbeCase> cases;
  for (int f = 0; f < kvcheck::impl::kFaultCount; ++f) {
    for (std::int64_t states : {1, 3, 4}) {
      for (std::int64_t ring : {1, 2, 3, 5, 7, 11}) {
        for (std::int64_t window : {1, 2, 3, 5, 7}) {
          for (std::int64_t state = 0; state < states; ++state) {
            for (std::int64_t p : {0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 21, 22, 23, 99, 1000003}) {
              cases.push_back({state, p, window, ring, states, static_cast<Fault>(f)});
            }
          }
        }
      }
    }
  }
  // The docs/semantics.md "Golden values" ring trace geometry: W = 128, S = 134, states 2 and 3.
  for (std::int64_t p : {127, 128, 133, 134, 135, 267, 268}) {
    cases.push_back({2, p, 128, 134, 4, Fault::kNone});
    cases.push_back({3, p, 128, 134, 4, Fault::kNone});
  }
  return cases;
}

ProbeResult gxx_probe(const ProbeCase& c, std::int64_t width) {
  ProbeResult r;
  r.meta = kvcheck::impl::ring_metadata(c.state, c.position, c.window_keys, c.ring_rows, c.states, c.fault);
  for (std::int64_t col = 0; col < width; ++col) {
    r.index.push_back(kvcheck::impl::ring_index_column(r.meta, col, c.ring_rows, c.fault));
  }
  r.rope_position = kvcheck::impl::ring_rope_position(c.position, c.ring_rows, c.fault);
  return r;
}

std::string describe(const ProbeCase& c) {
  return "state " + std::to_string(c.state) + " position " + std::to_string(c.position) + " W " +
         std::to_string(c.window_keys) + " S " + std::to_string(c.ring_rows) + " states " +
         std::to_string(c.states) + " fault " + std::string(kvcheck::impl::fault_name(c.fault));
}

void require_same(const ProbeResult& a, const ProbeResult& b, const ProbeCase& c) {
  INFO(describe(c));
  REQUIRE(a.meta.read_offset == b.meta.read_offset);
  REQUIRE(a.meta.length == b.meta.length);
  REQUIRE(a.meta.write_slot == b.meta.write_slot);
  REQUIRE(a.index == b.index);
  REQUIRE(a.rope_position == b.rope_position);
}

}  // namespace

TEST_CASE("ring_index: nvcc-compiled host math equals g++ and the model oracle", "[cuda][index]") {
  const std::vector<ProbeCase> cases = probe_grid();
  const std::vector<ProbeResult> nvcc = kvcheck::impl::cuda_test::nvcc_host_probe(cases, kWidth);
  REQUIRE(nvcc.size() == cases.size());
  std::size_t model_checked = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const ProbeCase& c = cases[i];
    require_same(nvcc[i], gxx_probe(c, kWidth), c);
    if (!address_fault_free(c.fault)) continue;
    INFO(describe(c));
    const kvcheck::model::Ring ring{c.states, c.ring_rows, c.window_keys};
    const kvcheck::model::DecodeMeta m = kvcheck::model::decode_meta(c.state, c.position, ring);
    REQUIRE(nvcc[i].meta.read_offset == m.read_offset);
    REQUIRE(nvcc[i].meta.length == m.length);
    REQUIRE(nvcc[i].meta.write_slot == m.write_slot);
    REQUIRE(nvcc[i].index == kvcheck::model::expand_index(c.state, c.position, ring, kWidth));
    ++model_checked;
  }
  REQUIRE(model_checked > cases.size() / 2);
}

TEST_CASE("ring_index: nvcc-compiled host math reproduces docs/semantics.md ring trace", "[cuda][index]") {
  struct Row {
    std::int64_t state, position, first, last, write;
  };
  // docs/semantics.md "Golden values": W = 128, S = 134; state 2 owns slots 268..401.
  const Row rows[] = {{2, 127, 268, 395, 395},
                      {2, 128, 269, 396, 396},
                      {2, 133, 274, 401, 401},
                      {2, 134, 275, 268, 268},
                      {3, 134, 409, 402, 402}};
  for (const Row& r : rows) {
    const ProbeCase c{r.state, r.position, 128, 134, 4, Fault::kNone};
    const ProbeResult p = kvcheck::impl::cuda_test::nvcc_host_probe({c}, 128).front();
    INFO(describe(c));
    REQUIRE(p.meta.length == 128);
    REQUIRE(p.meta.read_offset == r.first);
    REQUIRE(p.index.front() == r.first);
    REQUIRE(p.index.back() == r.last);
    REQUIRE(p.meta.write_slot == r.write);
  }
}

TEST_CASE("ring_index: device kernel math equals the host math", "[cuda][index][device]") {
  std::string why;
  if (!kvcheck::impl::cuda_device_available(&why)) {
    std::printf("SKIPPED (no CUDA device): %s\n", Catch::getResultCapture().getCurrentTestName().c_str());
    std::fflush(stdout);
    std::exit(4);
  }
  const std::vector<ProbeCase> cases = probe_grid();
  std::vector<ProbeResult> device;
  REQUIRE(kvcheck::impl::cuda_test::nvcc_device_probe(cases, kWidth, &device, &why));
  REQUIRE(device.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i)
    require_same(device[i], gxx_probe(cases[i], kWidth), cases[i]);
}

TEST_CASE("CudaBackend: the factory and the availability probe agree, in one line", "[cuda][factory]") {
  std::string available_why;
  const bool available = kvcheck::impl::cuda_device_available(&available_why);
  std::string why;
  auto direct = kvcheck::impl::make_cuda_backend(&why);
  std::string factory_why;
  auto via_factory = kvcheck::impl::make_backend("cuda", &factory_why);
  if (available) {
    REQUIRE(direct != nullptr);
    REQUIRE(direct->name() == "cuda");
    REQUIRE(via_factory != nullptr);
    REQUIRE(via_factory->name() == "cuda");
  } else {
    REQUIRE(direct == nullptr);
    REQUIRE(via_factory == nullptr);
    REQUIRE(why.rfind("no CUDA device", 0) == 0);
    REQUIRE(why.find('\n') == std::string::npos);
    REQUIRE(factory_why == why);
    REQUIRE(available_why == why);
  }
}
