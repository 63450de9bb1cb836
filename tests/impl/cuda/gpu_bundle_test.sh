#!/usr/bin/env bash
# The GPU bundle's layout, tested where it is built (no GPU needed):
# scripts/gpu-bundle.sh --no-build lays out this build tree's binaries, then
# scripts/gpu-check.sh --bundle runs from the bundle alone (LD_LIBRARY_PATH
# on its lib/, scenarios from its scenarios/). Asserts: every binary and the
# MANIFEST are there, every library resolves, the host steps pass, and
# without a GPU every device step reports SKIP (with a GPU it must PASS),
# in the full run and in --quick (whose subset runs no sanitizer or bench).
#   gpu_bundle_test.sh BUILD_DIR
set -u
BUILD=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "gpu_bundle_test: $*" >&2; exit 1; }

"$ROOT/scripts/gpu-bundle.sh" --no-build --build-dir "$BUILD" "$WORK/bundle" > "$WORK/bundle.log" 2>&1 ||
  { cat "$WORK/bundle.log"; fail "gpu-bundle.sh failed"; }
# Every binary of the one list (scripts/gpu-binaries.txt), and the rest.
mapfile -t bins < <(grep -v '^#' "$ROOT/scripts/gpu-binaries.txt" | grep -v '^$' | xargs -n1 basename | sed 's#^#bin/#')
for f in "${bins[@]}" scripts/gpu-check.sh scripts/gpu-binaries.txt scenarios/fast MANIFEST; do
  [[ -e "$WORK/bundle/$f" ]] || fail "bundle lacks $f"
done
grep -q "libmpfr" <(ls "$WORK/bundle/lib") || fail "bundle lib/ lacks libmpfr (the CLI and tests load it)"
if ls "$WORK/bundle/lib" | grep -qE '^(libc|libm|libstdc\+\+|libgcc_s)\.so'; then
  fail "bundle lib/ holds a base-system library"
fi
# The MANIFEST's checksums match the files.
(cd "$WORK/bundle" && sed -n '/^files:/,$p' MANIFEST | tail -n +2 | sha256sum --quiet -c -) ||
  fail "MANIFEST checksums do not match the bundle"

# Run from another directory, the bundle passed relative to it.
(cd "$WORK" && GPU_CHECK_SECONDS=120 bundle/scripts/gpu-check.sh --bundle bundle) > "$WORK/check.log" 2>&1
rc=$?
summary=$(sed -n '/gpu-check summary/,$p' "$WORK/check.log")
echo "$summary"
[[ $rc -eq 0 ]] || { cat "$WORK/check.log"; fail "gpu-check.sh --bundle exited $rc"; }
for step in "every library of bin/ resolves" "impl_cuda_host_test" "kvcheck --version and a CPU check"; do
  grep -q "PASS .*$step" <<< "$summary" || fail "host step not passed: $step"
done
if command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q "^GPU"; then
  grep -q "PASS .*impl_cuda_test" <<< "$summary" || fail "impl_cuda_test did not pass on a GPU machine"
else
  grep -q "^no GPU .*every device step is reported SKIP" "$WORK/check.log" || fail "no-GPU run does not say so"
  for step in "impl_cuda_test" "decode_attention_cuda_bench" "kvcheck check --impl cuda --profile production" \
              "kvcheck check --impl cpu --against cuda --profile production" "kvcheck check --impl cuda --cases 500" \
              "kvcheck check --impl cpu --against cuda --profile prefix" "kvcheck replay scenarios/fast --impl cuda" \
              "compute-sanitizer racecheck (fast kernel)"; do
    grep -qF "SKIP     $step" <<< "$summary" || fail "device step not reported skipped: $step"
  done
  # Without a device, --impl cuda (alone or as the second cache) is one typed
  # error line and exit 2, never a crash.
  for args in "--impl cuda" "--impl cpu --against cuda"; do
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH="$WORK/bundle/lib" "$WORK/bundle/bin/kvcheck" check $args --cases 3 --out "$WORK/nodev" \
      > "$WORK/nodev.out" 2> "$WORK/nodev.err"
    rc=$?
    [[ $rc -eq 2 ]] || { cat "$WORK/nodev.err"; fail "check $args without a device exited $rc, not 2"; }
    [[ $(wc -l < "$WORK/nodev.err") -eq 1 ]] && grep -q "error 500.*no CUDA device" "$WORK/nodev.err" ||
      { cat "$WORK/nodev.err"; fail "check $args without a device: not one 'error 500 ... no CUDA device' line"; }
  done
  # --quick: the host steps, then its device subset skipped; nothing else.
  (cd "$WORK" && bundle/scripts/gpu-check.sh --quick --bundle bundle) > "$WORK/quick.log" 2>&1 ||
    { cat "$WORK/quick.log"; fail "gpu-check.sh --quick --bundle exited nonzero"; }
  quick=$(sed -n '/gpu-check summary/,$p' "$WORK/quick.log")
  grep -q "of 170s" <<< "$quick" || fail "--quick does not run under its 170 s budget"
  for step in "impl_cuda_test" "kvcheck check --impl cuda --profile production --cases 60" \
              "kvcheck check --impl cpu --against cuda --cases 200" "kvcheck replay scenarios/fast --impl cuda"; do
    grep -qF "SKIP     $step" <<< "$quick" || fail "--quick device step not reported skipped: $step"
  done
  grep -qE "compute-sanitizer|decode_attention|--profile trim" <<< "$quick" && fail "--quick ran more than its subset"
  # --require-gpu turns the missing GPU into a failure.
  (cd "$WORK" && GPU_CHECK_ONLY=none bundle/scripts/gpu-check.sh --require-gpu --bundle bundle) > /dev/null 2>&1 &&
    fail "--require-gpu without a GPU exited 0"
fi
echo "gpu_bundle_test: ok"
