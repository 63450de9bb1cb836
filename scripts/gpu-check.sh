#!/usr/bin/env bash
# gpu-check.sh: everything the CUDA backend needs checked on a machine with a
# GPU, in one run that fits in 8 minutes (each step under `timeout`, all of
# them under one deadline), ending with a one-line-per-step summary.
#
#   scripts/gpu-check.sh [--require-gpu] [--quick] [build-dir]     build here, then check (default build-gpu)
#   scripts/gpu-check.sh [--require-gpu] [--quick] --bundle DIR    check a bundle from scripts/gpu-bundle.sh
#
# The source mode needs the build dependencies (MPFR, GMP, Catch2,
# RapidCheck, Google Benchmark) on the GPU machine; the bundle mode needs only
# the CUDA driver: binaries and their non-system libraries come in the bundle
# (built elsewhere with nvcc), and LD_LIBRARY_PATH points at its lib/.
#
# Steps, most important first: the CUDA backend tests (impl_cuda_test:
# conformance suite on "cuda", kernel-by-kernel comparisons with the CPU
# backend, the production-shape fast-kernel tests, the dispatch the host
# predicts; impl_cuda_host_test: the index math as nvcc compiled it and the
# attention dispatch), `kvcheck check --impl cuda --profile production`
# (its coverage gate asks for every CUDA dispatch class: general,
# slot-major, warp-pipelined, split-K) and `--impl cpu --against cuda` on
# it, the CUDA decode-attention benchmark (the roofline figures), every other
# profile on `--impl cuda` and against the CPU pool, `kvcheck replay
# scenarios/fast --impl cuda`, compute-sanitizer memcheck / racecheck /
# initcheck on the attention tests, and the CPU decode-attention benchmark.
# --quick runs a subset in under 3 minutes (budget 170 s): the tests, a
# production check on cuda, a default check against the CPU pool, replay.
# Without a GPU (no `nvidia-smi -L` device) the device steps report SKIP and
# the host steps still run; --require-gpu makes a missing GPU a failure.
# GPU_CHECK_ONLY=REGEX runs only the steps whose names match (grep -E), for
# a quick rerun of a few steps; GPU_CHECK_SECONDS sets the budget (480, or
# 170 with --quick).
# Exit status: 0 when every step that ran passed, 1 otherwise.
set -u
ORIGIN=$PWD
cd "$(dirname "$0")/.." || exit 1
BUNDLE=
BUILD=build-gpu
REQUIRE_GPU=0
QUICK=0
while (( $# > 0 )); do
  case "$1" in
    --bundle) BUNDLE=$(cd "$ORIGIN" && cd "$2" && pwd) || exit 2; shift 2 ;;
    --require-gpu) REQUIRE_GPU=1; shift ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "gpu-check.sh: unknown option $1" >&2; exit 2 ;;
    *) BUILD=$1; shift ;;
  esac
done
if (( QUICK )); then
  BUDGET=${GPU_CHECK_SECONDS:-170}  # the --quick subset
else
  BUDGET=${GPU_CHECK_SECONDS:-480}  # the whole run; each step is capped as well
fi
DEADLINE=$(( $(date +%s) + BUDGET ))
JOBS=${JOBS:-16}
SUMMARY=()
FAILED=0

remaining() { echo $(( DEADLINE - $(date +%s) )); }

# step NAME CAP_SECONDS COMMAND...: runs COMMAND under timeout min(CAP, time
# left before the deadline), records PASS / FAIL (rc) / TIMEOUT / SKIP.
step() {
  local name=$1 cap=$2
  shift 2
  if [[ -n "${GPU_CHECK_ONLY:-}" ]] && ! grep -qE "$GPU_CHECK_ONLY" <<< "$name"; then
    SUMMARY+=("SKIP     $name (not in GPU_CHECK_ONLY)")
    return 0
  fi
  local left
  left=$(remaining)
  if (( left < 10 )); then
    SUMMARY+=("SKIP     $name (${BUDGET}s budget spent)")
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

skip() { note "SKIP     $1"; }

HAVE_GPU=0
if command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q "^GPU"; then
  HAVE_GPU=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
elif (( REQUIRE_GPU )); then
  note "FAIL     --require-gpu: no GPU listed by nvidia-smi -L"
  FAILED=1
else
  echo "no GPU (nvidia-smi -L lists none): the host steps run, every device step is reported SKIP"
fi
(( QUICK )) && echo "--quick: the tests, a production check on cuda, a check against the CPU pool, replay"

# The bundle's binaries, one list (scripts/gpu-binaries.txt; a bundle carries
# it beside this script): build-tree paths, the target is the file name.
mapfile -t GPU_BINARIES < <(grep -v '^#' scripts/gpu-binaries.txt | grep -v '^$')
# The same list split by its "# build: cuda|host" marks into the targets of
# the two build steps (a path before any mark, or under another mark, is a
# host target).
CUDA_TARGETS=()
HOST_TARGETS=()
build_section=host
while IFS= read -r line; do
  if [[ $line =~ ^#\ build:\ *([a-z]+) ]]; then
    build_section=${BASH_REMATCH[1]}
  elif [[ -n $line && $line != \#* ]]; then
    if [[ $build_section == cuda ]]; then CUDA_TARGETS+=("$(basename "$line")"); else HOST_TARGETS+=("$(basename "$line")"); fi
  fi
done < scripts/gpu-binaries.txt

if [[ -n "$BUNDLE" ]]; then
  BIN="$BUNDLE/bin"
  SCENARIOS="$BUNDLE/scenarios"
  export LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [[ -f "$BUNDLE/MANIFEST" ]] && sed -n '2,4p' "$BUNDLE/MANIFEST"
  for b in "${GPU_BINARIES[@]}"; do
    b=$(basename "$b")
    if [[ ! -x "$BIN/$b" ]]; then
      note "FAIL     bundle lacks bin/$b"
      FAILED=1
    fi
  done
  # Every library a binary needs resolves (from the bundle or the system).
  missing=$(for b in "$BIN"/*; do ldd "$b" 2> /dev/null | grep "not found"; done | sort -u)
  if [[ -n "$missing" ]]; then
    note "FAIL     unresolved libraries: $(echo "$missing" | tr -s ' \n' ' ')"
    FAILED=1
  else
    note "PASS     every library of bin/ resolves ($(ls "$BUNDLE/lib" | wc -l) from the bundle)"
  fi
else
  BIN_ROOT="$BUILD"
  SCENARIOS=scenarios
  step "configure" 90 cmake -S . -B "$BUILD" -DKVCHECK_CUDA=ON -DKVCHECK_BENCH=ON \
    -DCMAKE_BUILD_TYPE=Release || true
  if ! grep -q "KVCHECK_CUDA:BOOL=ON" "$BUILD/CMakeCache.txt" 2> /dev/null; then
    note "FAIL     configure did not enable CUDA"
    FAILED=1
  fi
  # The CUDA targets first (so a broken unrelated target cannot hide them).
  if (( ${#CUDA_TARGETS[@]} == 0 )); then
    note "FAIL     scripts/gpu-binaries.txt marks no CUDA target (# build: cuda)"
    FAILED=1
  else
    step "build CUDA targets (${CUDA_TARGETS[*]})" 240 cmake --build "$BUILD" -j "$JOBS" --target "${CUDA_TARGETS[@]}" || true
  fi
  (( ${#HOST_TARGETS[@]} > 0 )) &&
    { step "build host targets (${HOST_TARGETS[*]})" 150 cmake --build "$BUILD" -j "$JOBS" --target "${HOST_TARGETS[@]}" || true; }
  BIN=$(mktemp -d)
  trap 'rm -rf "$BIN"' EXIT
  for b in "${GPU_BINARIES[@]}"; do
    [[ -x "$BIN_ROOT/$b" ]] && ln -s "$(cd "$(dirname "$BIN_ROOT/$b")" && pwd)/$(basename "$b")" "$BIN/"
  done
fi

# device_step NAME CAP COMMAND...: a step that needs the GPU.
device_step() {
  if (( HAVE_GPU )); then
    step "$@" || true
  else
    skip "$1 (no GPU)"
  fi
}
# A CUDA test binary that reports a case skipped on a GPU machine did not see
# the device: that is a failure, not a pass.
cuda_tests() {
  local log
  log=$(mktemp)
  "$BIN/impl_cuda_test" --reporter compact 2>&1 | tee "$log" | tail -40
  local rc=${PIPESTATUS[0]}
  if grep -q "SKIPPED (no CUDA device)" "$log"; then
    echo "impl_cuda_test skipped cases on a GPU machine: the device was not seen"
    rc=1
  fi
  rm -f "$log"
  return "$rc"
}

CLI="$BIN/kvcheck"
if [[ -x "$BIN/impl_cuda_host_test" ]]; then
  if (( HAVE_GPU )); then
    step "impl_cuda_host_test (index math as nvcc compiled it)" 60 "$BIN/impl_cuda_host_test" || true
  else
    # Exit 4: the cases that launch kernels reported themselves skipped.
    step "impl_cuda_host_test (host cases; device cases skip)" 60 sh -c '"$0" > /dev/null; rc=$?; [ $rc -eq 0 ] || [ $rc -eq 4 ]' "$BIN/impl_cuda_host_test" || true
  fi
fi
if [[ -x "$CLI" ]]; then
  step "kvcheck --version and a CPU check from the bundle" 60 sh -c "\"$CLI\" --version && \"$CLI\" check --impl cpu --cases 50 --seed 1 --out \"\$(mktemp -d)\" > /dev/null" || true
fi
export BIN
[[ -x "$BIN/impl_cuda_test" ]] && device_step "impl_cuda_test (CUDA backend vs CPU backend, conformance)" 150 \
  bash -c "$(declare -f cuda_tests); cuda_tests"

BENCH="$BIN/decode_attention_cuda_bench"
# check_step CAP CASES ARGS...: one `kvcheck check` on the device; its name
# is the command line. Every run fails on a failing case, on a reachable
# coverage class never reached (the production profile gates the CUDA
# dispatch classes) and on too few cases run.
check_step() {
  local cap=$1 cases=$2
  shift 2
  device_step "kvcheck check $* --cases $cases" "$cap" "$CLI" check "$@" --cases "$cases" --out "$(mktemp -d)"
}

if [[ ! -x "$CLI" ]]; then
  note "FAIL     kvcheck CLI missing ($CLI): check and replay not run"
  FAILED=1
elif (( QUICK )); then
  check_step 60 60 --impl cuda --profile production
  check_step 40 200 --impl cpu --against cuda
  device_step "kvcheck replay scenarios/fast --impl cuda" 30 "$CLI" replay "$SCENARIOS/fast" --impl cuda
else
  check_step 90 200 --impl cuda --profile production
  check_step 90 100 --impl cpu --against cuda --profile production
  [[ -x "$BENCH" ]] && device_step "decode_attention_cuda_bench" 100 "$BENCH" --benchmark_min_time=0.2
  check_step 60 500 --impl cuda
  check_step 45 300 --impl cpu --against cuda
  for profile in trim layers paged prefix; do
    check_step 30 150 --impl cuda --profile "$profile"
    check_step 30 100 --impl cpu --against cuda --profile "$profile"
  done
  device_step "kvcheck replay scenarios/fast --impl cuda" 60 "$CLI" replay "$SCENARIOS/fast" --impl cuda
fi

SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
TEST_BIN="$BIN/impl_cuda_test"
ATTEND_CASE="CudaBackend: attention over pool and scratch equals the CPU backend's"
FAST_CASE="CudaBackend: production shapes (head_dim 128 and W = 4096) count every column once"
COLLIDE_CASE="CudaBackend: a same-launch write-write collision is counted and the last row wins"
if (( QUICK )); then
  : # --quick: no compute-sanitizer runs, no benchmarks
elif (( HAVE_GPU )) && [[ ! -x "$SANITIZER" ]]; then
  note "FAIL     compute-sanitizer not found"
  FAILED=1
elif [[ -x "$TEST_BIN" ]]; then
  # sanitize TOOL LABEL CAP CASE: one compute-sanitizer run of one test case.
  sanitize() {
    device_step "compute-sanitizer $1 ($2)" "$3" "$SANITIZER" --tool "$1" --error-exitcode 99 \
      "$TEST_BIN" "$4"
  }
  sanitize memcheck "fast kernel" 90 "$FAST_CASE"
  sanitize memcheck "attention" 60 "$ATTEND_CASE"
  sanitize racecheck "fast kernel" 90 "$FAST_CASE"
  sanitize racecheck "general kernel" 60 "$ATTEND_CASE"
  sanitize initcheck "fast kernel" 60 "$FAST_CASE"
  sanitize memcheck "store collision" 30 "$COLLIDE_CASE"
fi

CPU_BENCH="$BIN/decode_attention_bench"
(( ! QUICK )) && [[ -x "$CPU_BENCH" ]] && device_step "decode_attention_bench (CPU, same machine)" 100 "$CPU_BENCH" --benchmark_min_time=0.1

echo
echo "=== gpu-check summary ($(( BUDGET - $(remaining) ))s of ${BUDGET}s) ==="
for line in "${SUMMARY[@]}"; do echo "  $line"; done
exit $FAILED
