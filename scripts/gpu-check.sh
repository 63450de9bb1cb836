#!/usr/bin/env bash
# gpu-check.sh: everything the CUDA backend needs checked on a machine with a
# GPU, in one run that fits in 8 minutes (each step under `timeout`, all of
# them under one deadline), ending with a one-line-per-step summary.
#
#   scripts/gpu-check.sh [build-dir]        (default: build-gpu)
#
# Steps: configure + build (-DKVCHECK_CUDA=ON, -j16), every CUDA ctest
# (ctest -R cuda: index math, conformance suite with "cuda", kernel-by-kernel
# comparisons with the CPU backend), `kvcheck check --impl cuda --cases 500`,
# `kvcheck replay scenarios/fast --impl cuda`, compute-sanitizer memcheck and
# racecheck on the attention test (the kernel with shared memory and
# shuffles), and the CUDA decode-attention benchmark.
# Exit status: 0 when every step that ran passed (a missing CLI is reported
# and not counted as a failure), 1 otherwise.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:-build-gpu}
DEADLINE=$(( $(date +%s) + 480 ))
JOBS=${JOBS:-16}
SUMMARY=()
FAILED=0

remaining() { echo $(( DEADLINE - $(date +%s) )); }

# step NAME CAP_SECONDS COMMAND...: runs COMMAND under timeout min(CAP, time
# left before the deadline), records PASS / FAIL (rc) / TIMEOUT / SKIP.
step() {
  local name=$1 cap=$2
  shift 2
  local left
  left=$(remaining)
  if (( left < 10 )); then
    SUMMARY+=("SKIP     $name (8-minute budget spent)")
    return 0
  fi
  local limit=$(( cap < left ? cap : left ))
  echo
  echo "=== $name (limit ${limit}s) ==="
  local start
  start=$(date +%s)
  timeout --kill-after=5 "$limit" "$@"
  local rc=$?
  local took=$(( $(date +%s) - start ))
  if (( rc == 0 )); then
    SUMMARY+=("PASS     $name (${took}s)")
  elif (( rc == 124 || rc == 137 )); then
    SUMMARY+=("TIMEOUT  $name (${limit}s)")
    FAILED=1
  else
    SUMMARY+=("FAIL     $name (rc $rc, ${took}s)")
    FAILED=1
  fi
  return $rc
}

note() { SUMMARY+=("$1"); echo "$1"; }

if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

step "configure" 90 cmake -S . -B "$BUILD" -DKVCHECK_CUDA=ON -DKVCHECK_BENCH=ON \
  -DCMAKE_BUILD_TYPE=Release || true
if ! grep -q "KVCHECK_CUDA:BOOL=ON" "$BUILD/CMakeCache.txt" 2> /dev/null; then
  note "FAIL     configure did not enable CUDA"
  FAILED=1
fi

# The CUDA targets first (so a broken unrelated target cannot hide them),
# then everything else the CLI needs.
step "build CUDA targets" 240 cmake --build "$BUILD" -j "$JOBS" --target kvcheck_cuda \
  impl_cuda_host_test impl_cuda_test decode_attention_cuda_bench || true
step "build kvcheck CLI" 150 cmake --build "$BUILD" -j "$JOBS" --target kvcheck || true

step "ctest -R cuda" 150 ctest --test-dir "$BUILD" -R cuda --output-on-failure -j 4 || true
# A CUDA case that reports itself skipped on a GPU machine means the device
# was not seen: that is a failure here, not a pass.
skipped=$(grep -c "SKIPPED (no CUDA device)" "$BUILD/Testing/Temporary/LastTest.log" 2> /dev/null || true)
if [[ "${skipped:-0}" != "0" ]]; then
  note "FAIL     $skipped CUDA test(s) skipped: no device seen on a GPU machine"
  FAILED=1
fi

CLI="$BUILD/cli/kvcheck"
if [[ -x "$CLI" ]]; then
  step "kvcheck check --impl cuda --cases 500" 90 "$CLI" check --impl cuda --cases 500 || true
  if [[ -d scenarios/fast ]]; then
    step "kvcheck replay scenarios/fast --impl cuda" 60 "$CLI" replay scenarios/fast --impl cuda || true
  else
    note "SKIP     replay: scenarios/fast not found"
  fi
else
  note "SKIP     kvcheck CLI not built ($CLI missing): check and replay not run"
fi

SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
TEST_BIN="$BUILD/tests/impl/cuda/impl_cuda_test"
ATTEND_CASE="CudaBackend: attention over pool and scratch equals the CPU backend's"
COLLIDE_CASE="CudaBackend: a same-launch write-write collision is counted and the last row wins"
if [[ -x "$SANITIZER" && -x "$TEST_BIN" ]]; then
  step "compute-sanitizer memcheck (attention)" 90 "$SANITIZER" --tool memcheck \
    --error-exitcode 99 "$TEST_BIN" "$ATTEND_CASE" || true
  step "compute-sanitizer racecheck (attention)" 90 "$SANITIZER" --tool racecheck \
    --error-exitcode 99 "$TEST_BIN" "$ATTEND_CASE" || true
  step "compute-sanitizer memcheck (store collision)" 30 "$SANITIZER" --tool memcheck \
    --error-exitcode 99 "$TEST_BIN" "$COLLIDE_CASE" || true
else
  note "SKIP     compute-sanitizer or $TEST_BIN missing"
  FAILED=1
fi

BENCH="$BUILD/bench/cuda/decode_attention_cuda_bench"
if [[ -x "$BENCH" ]]; then
  step "decode_attention_cuda_bench" 60 "$BENCH" --benchmark_min_time=0.5 || true
else
  note "FAIL     $BENCH not built"
  FAILED=1
fi

echo
echo "=== gpu-check summary ($(( 480 - $(remaining) ))s of 480s) ==="
for line in "${SUMMARY[@]}"; do echo "  $line"; done
exit $FAILED
