// KVCHECK_HOST_DEVICE marks index and format math that the CUDA kernels and
// the CPU backend share, so the CPU test suite exercises the very functions
// the kernels call. Without nvcc it expands to nothing.
#pragma once

#if defined(__CUDACC__)
#define KVCHECK_HOST_DEVICE __host__ __device__ inline
#else
#define KVCHECK_HOST_DEVICE inline
#endif
