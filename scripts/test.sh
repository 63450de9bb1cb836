#!/usr/bin/env bash
# Set up, build everything (CUDA sources too when nvcc is present) with
# warnings as errors, run the whole test suite through ctest, then build and
# run it again under AddressSanitizer + UndefinedBehaviorSanitizer.
# KVCHECK_SKIP_SANITIZE=1 skips the second build (for quick local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${KVCHECK_SKIP_SANITIZE:-0}" != "1" ]; then
  # No MPI here: OpenMPI's own allocations would be LeakSanitizer reports;
  # kvcheck's MPI glue is the Release tree's (its mpi test there), and the
  # sharded path it drives is tested here too, without mpirun.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVCHECK_SANITIZE=ON \
        -DKVCHECK_CUDA=OFF -DKVCHECK_BENCH=OFF -DKVCHECK_MPI=OFF
  cmake --build build-asan -j"$jobs"
  # The sanitizer run skips the tests whose cost is a long loop the Release
  # run above already ran (2000-case fault sweeps, the full sweep grid, the
  # 100,000-row long-context runs): under ASan they would take ~10 of CI's
  # 20 minutes and reach no code the rest of the suite does not.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" \
      -E 'every named fault fails check at 2000|full default grid|100000-row|RoPE angles formed in float32|every adapter bug switch'
fi
