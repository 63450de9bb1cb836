// nvcc-compiled evaluation of impl/ring_index.hpp (see ring_index_probe.hpp).
#include "tests/impl/cuda/ring_index_probe.hpp"

#include <cuda_runtime.h>

#include "impl/ring_index.hpp"

namespace kvcheck::impl::cuda_test {

namespace {

// [n] meta, [n, width] index, [n] rope position: one thread per case.
__global__ void probe_kernel(const ProbeCase* cases, std::int64_t n, std::int64_t width, ReadMeta* meta,
                             std::int64_t* index, std::int64_t* rope) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const ProbeCase c = cases[i];
  const ReadMeta m = ring_metadata(c.state, c.position, c.window_keys, c.ring_rows, c.states, c.fault);
  meta[i] = m;
  for (std::int64_t col = 0; col < width; ++col) {
    index[i * width + col] = ring_index_column(m, col, c.ring_rows, c.fault);
  }
  rope[i] = ring_rope_position(c.position, c.ring_rows, c.fault);
}

std::string cuda_line(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

}  // namespace

std::vector<ProbeResult> nvcc_host_probe(const std::vector<ProbeCase>& cases, std::int64_t width) {
  std::vector<ProbeResult> out;
  out.reserve(cases.size());
  for (const ProbeCase& c : cases) {
    ProbeResult r;
    r.meta = ring_metadata(c.state, c.position, c.window_keys, c.ring_rows, c.states, c.fault);
    for (std::int64_t col = 0; col < width; ++col) {
      r.index.push_back(ring_index_column(r.meta, col, c.ring_rows, c.fault));
    }
    r.rope_position = ring_rope_position(c.position, c.ring_rows, c.fault);
    out.push_back(std::move(r));
  }
  return out;
}

bool nvcc_device_probe(const std::vector<ProbeCase>& cases, std::int64_t width, std::vector<ProbeResult>* out,
                       std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    if (why) *why = err != cudaSuccess ? cuda_line("no CUDA device", err) : "no CUDA device";
    return false;
  }
  const auto n = static_cast<std::int64_t>(cases.size());
  if (n == 0) {
    out->clear();
    return true;
  }
  ProbeCase* d_cases = nullptr;
  ReadMeta* d_meta = nullptr;
  std::int64_t* d_index = nullptr;
  std::int64_t* d_rope = nullptr;
  std::vector<ReadMeta> meta(cases.size());
  std::vector<std::int64_t> index(cases.size() * static_cast<std::size_t>(width));
  std::vector<std::int64_t> rope(cases.size());
  const char* what = "cudaMalloc";
  err = cudaMalloc(&d_cases, cases.size() * sizeof(ProbeCase));
  if (err == cudaSuccess) err = cudaMalloc(&d_meta, meta.size() * sizeof(ReadMeta));
  if (err == cudaSuccess)
    err = cudaMalloc(&d_index, (index.empty() ? 1 : index.size()) * sizeof(std::int64_t));
  if (err == cudaSuccess) err = cudaMalloc(&d_rope, rope.size() * sizeof(std::int64_t));
  if (err == cudaSuccess) {
    what = "cudaMemcpy(cases)";
    err = cudaMemcpy(d_cases, cases.data(), cases.size() * sizeof(ProbeCase), cudaMemcpyHostToDevice);
  }
  if (err == cudaSuccess) {
    what = "launch probe_kernel";
    probe_kernel<<<static_cast<unsigned>((n + 127) / 128), 128>>>(d_cases, n, width, d_meta, d_index, d_rope);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    what = "cudaMemcpy(results)";
    err = cudaMemcpy(meta.data(), d_meta, meta.size() * sizeof(ReadMeta), cudaMemcpyDeviceToHost);
    if (err == cudaSuccess && !index.empty()) {
      err = cudaMemcpy(index.data(), d_index, index.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost);
    }
    if (err == cudaSuccess) {
      err = cudaMemcpy(rope.data(), d_rope, rope.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost);
    }
  }
  cudaFree(d_cases);
  cudaFree(d_meta);
  cudaFree(d_index);
  cudaFree(d_rope);
  if (err != cudaSuccess) {
    if (why) *why = cuda_line(what, err);
    return false;
  }
  out->clear();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    ProbeResult r;
    r.meta = meta[i];
    r.index.assign(index.begin() + static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(width)),
                   index.begin() + static_cast<std::ptrdiff_t>((i + 1) * static_cast<std::size_t>(width)));
    r.rope_position = rope[i];
    out->push_back(std::move(r));
  }
  return true;
}

}  // namespace kvcheck::impl::cuda_test
