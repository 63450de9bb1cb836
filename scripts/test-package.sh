#!/usr/bin/env bash
# kvcheck as a CMake package, end to end: install a build into a temporary
# prefix, build examples/engine-test (an engine's test suite with a toy cache
# of its own) against that prefix only, and run its test.
#
#   scripts/test-package.sh             # configures and builds the libraries in a temporary dir
#   scripts/test-package.sh BUILD_DIR   # installs that build as it is (nothing is rebuilt)
#
# ctest runs it with the tree's own build dir ("package: ..."). Exits non-zero
# on any failure. KVCHECK_PACKAGE_KEEP=1 keeps the temporary dir; KVCHECK_JOBS
# sets the parallel jobs (default 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${KVCHECK_JOBS:-2}
start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-package.XXXXXX")
cleanup() {
  if [ "${KVCHECK_PACKAGE_KEEP:-0}" = 1 ]; then echo "test-package: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

if [ $# -ge 1 ]; then
  [ -f "$1/CMakeCache.txt" ] || { echo "test-package: $1 is not a CMake build tree" >&2; exit 2; }
  build=$(cd "$1" && pwd)
else
  # Only the libraries the package installs (no tests, benchmarks or CLI).
  build=$work/kvcheck-build
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVCHECK_CUDA=OFF -DKVCHECK_BENCH=OFF >/dev/null
  cmake --build "$build" -j"$jobs" --target kvcheck_api kvcheck_sweep kvcheck_reports
fi

prefix=$work/prefix
echo "test-package: installing $build into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
if [ -z "$(find "$prefix" -name kvcheckConfig.cmake -print -quit)" ]; then
  echo "test-package: no kvcheckConfig.cmake installed" >&2
  exit 1
fi

# The example sees the installed prefix and nothing of this source tree.
example=$work/engine-test
echo "test-package: building examples/engine-test against the package"
cmake -S "$root/examples/engine-test" -B "$example" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_COMPILE_WARNING_AS_ERROR=ON >/dev/null
cmake --build "$example" -j"$jobs"
TMPDIR=$work ctest --test-dir "$example" --output-on-failure
echo "test-package: PASS in $(( $(date +%s) - start )) s"
