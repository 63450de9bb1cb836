#!/usr/bin/env bash
# gpu-bundle.sh: builds here (nvcc, no GPU needed) everything the GPU check
# runs, and lays it into one folder that runs on a GPU machine which has the
# CUDA driver but none of kvcheck's build dependencies (no MPFR, GMP, Catch2,
# RapidCheck, Google Benchmark; nothing can be installed there):
#
#   scripts/gpu-bundle.sh [--build-dir DIR] [--no-build] [OUT]   (OUT: gpu-bundle)
#   scripts/gpu-check.sh --require-gpu [--quick] --bundle OUT    (on the GPU machine)
#
# What the GPU machine runs is gpu-check.sh's list (within 8 minutes; --quick
# within 3): the CUDA tests, `kvcheck check --impl cuda` on every profile
# (production first: its coverage gate asks for every CUDA dispatch class)
# and `--impl cpu --against cuda` on each, the replay of the bundled
# scenarios, compute-sanitizer and the benchmarks. The CLI carries every
# profile, so the bundle needs nothing per profile.
#
# OUT/
#   bin/       the binaries listed in scripts/gpu-binaries.txt (kvcheck,
#              the CUDA tests, the CUDA and CPU decode-attention benchmarks)
#   lib/       every shared library those binaries load that is not part of
#              the base system (libc, libm, libstdc++, libgcc_s, the loader):
#              libmpfr, libgmp, libbenchmark, ...; gpu-check.sh puts it on
#              LD_LIBRARY_PATH. The CUDA runtime is linked statically; the
#              driver (libcuda) comes from the GPU machine.
#   scenarios/ the bundled scenarios replayed on the device.
#   scripts/gpu-check.sh, scripts/gpu-binaries.txt
#   MANIFEST   commit, build flags, and the sha256 of every file.
#
# No binary in bin/ needs the source tree: the CLI's compiled-in source path
# (KVCHECK_SOURCE_DIR) is used only by `kvcheck demo` for its defaults, and
# gpu-check.sh passes every path explicitly. The build is Release with
# -DKVCHECK_CUDA_ARCHITECTURES=90-real;90-virtual (sm_90 code plus PTX newer
# GPUs JIT-compile), MPI off (a GPU machine need not have OpenMPI).
# --no-build lays out an existing build (the test of the layout uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu
OUT=
NO_BUILD=0
while (( $# > 0 )); do
  case "$1" in
    --build-dir) BUILD=$2; shift 2 ;;
    --no-build) NO_BUILD=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "gpu-bundle.sh: unknown option $1" >&2; exit 2 ;;
    *) OUT=$1; shift ;;
  esac
done
OUT=${OUT:-gpu-bundle}

NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [[ ! -x "$NVCC" ]]; then
  echo "gpu-bundle.sh: nvcc not found (PATH or /usr/local/cuda/bin): the CUDA toolkit is needed to build the bundle" >&2
  exit 2
fi

# The one list of bundle binaries (build-tree paths; the target is the file name).
mapfile -t BINS < <(grep -v '^#' scripts/gpu-binaries.txt | grep -v '^$')
TARGETS=()
for b in "${BINS[@]}"; do TARGETS+=("$(basename "$b")"); done
if (( NO_BUILD == 0 )); then
  scripts/setup.sh
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVCHECK_CUDA=ON -DKVCHECK_BENCH=ON \
        -DKVCHECK_MPI=OFF -DCMAKE_CUDA_COMPILER="$NVCC" \
        "-DKVCHECK_CUDA_ARCHITECTURES=90-real;90-virtual" > /dev/null
  cmake --build "$BUILD" -j"$(nproc 2>/dev/null || echo 2)" --target "${TARGETS[@]}"
fi
for b in "${BINS[@]}"; do
  if [[ ! -x "$BUILD/$b" ]]; then
    echo "gpu-bundle.sh: $BUILD/$b was not built (is $BUILD configured with CUDA and benchmarks?)" >&2
    exit 2
  fi
done

# Build the new bundle beside OUT and swap it in whole: a bundle is never
# half written, and a failed run leaves the previous one as it was.
STAGE=$(mktemp -d "${OUT%/}.tmp-XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/scripts" "$STAGE/scenarios"
for b in "${BINS[@]}"; do cp "$BUILD/$b" "$STAGE/bin/"; done
cp scripts/gpu-check.sh scripts/gpu-binaries.txt "$STAGE/scripts/"
cp -r scenarios/fast scenarios/regressions "$STAGE/scenarios/"

# Non-system shared libraries, by what the loader resolves here.
is_base() {
  case "$1" in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*|linux-vdso*) return 0 ;;
  esac
  return 1
}
for b in "$STAGE"/bin/*; do
  while read -r name _ path _; do
    [[ -n "${path:-}" && -f "$path" ]] || continue
    is_base "$name" && continue
    [[ -f "$STAGE/lib/$name" ]] || cp -L "$path" "$STAGE/lib/$name"
  done < <(ldd "$b" | grep "=>")
done

{
  echo "kvcheck GPU bundle"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(uname -srm), $(g++ --version | head -1), $("$NVCC" --version | tail -1)"
  echo "cuda architectures: $(grep '^KVCHECK_CUDA_ARCHITECTURES' "$BUILD/CMakeCache.txt" | cut -d= -f2)"
  echo "files:"
  (cd "$STAGE" && find . -type f ! -name MANIFEST | LC_ALL=C sort | xargs sha256sum)
} > "$STAGE/MANIFEST"

rm -rf "${OUT%/}.old"
[[ -e "$OUT" ]] && mv "$OUT" "${OUT%/}.old"
mv "$STAGE" "$OUT"
rm -rf "${OUT%/}.old"
trap - EXIT
echo "gpu-bundle.sh: $(du -sh "$OUT" | cut -f1) in $OUT ($(ls "$OUT/bin" | wc -l) binaries, $(ls "$OUT/lib" | wc -l) libraries)"
echo "  on the GPU machine: $OUT/scripts/gpu-check.sh --require-gpu --bundle $OUT    (at most 8 minutes)"
echo "                  or: $OUT/scripts/gpu-check.sh --require-gpu --quick --bundle $OUT    (at most 3 minutes)"
