#!/usr/bin/env bash
# Set up, build everything (CUDA sources too when nvcc is present) with
# warnings as errors, run the whole test suite through ctest, then build and
# run it again under AddressSanitizer + UndefinedBehaviorSanitizer.
# KVCHECK_SKIP_SANITIZE=1 skips the second build (for quick local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
# One compile more than cores: links and file reads leave a core idle
# otherwise (24 GiB hold three of the heaviest translation units easily).
build_jobs=$((jobs + 1))

# Ninja where it is installed (setup.sh installs it): it compiles a
# target's files while the libraries it links are still being built, where
# Make's generator waits for each library in turn; a tree configured
# earlier with another generator keeps it.
generator_for() {
  if [ -f "$1/CMakeCache.txt" ]; then
    sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$1/CMakeCache.txt"
  elif command -v ninja >/dev/null 2>&1; then
    echo Ninja
  else
    echo "Unix Makefiles"
  fi
}

# Unity builds (CMake joins up to 8 of a target's sources into one
# translation unit): the headers every file includes (Boost.Multiprecision,
# nlohmann/json, Catch2) are parsed once per batch instead of once per file,
# about a third of both trees' compile time (docs/measurements.md "CI time").
# Only this script asks for them: an edit in a tree of your own recompiles
# one file, not its batch. A file-local name must therefore be unique within
# its target (an anonymous namespace is shared by the batch).
unity=-DCMAKE_UNITY_BUILD=ON
cmake -S . -B build -G "$(generator_for build)" -DCMAKE_BUILD_TYPE=Release "$unity"
cmake --build build -j"$build_jobs"

# The tests start Python (the bundled adapters, the test drivers) thousands
# of times: they run Debian's /usr/bin/python3, the interpreter that serves
# the python3-* packages setup.sh installs, ahead of any version manager's
# shim earlier on PATH (a pyenv shim costs 0.35 s of CPU a start, and made
# the adapter tests two to three times slower).
if [ -x /usr/bin/python3 ]; then
  python_dir=$(mktemp -d)
  trap 'rm -rf "$python_dir"' EXIT
  ln -s /usr/bin/python3 "$python_dir/python3"
  export PATH="$python_dir:$PATH"
fi
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${KVCHECK_SKIP_SANITIZE:-0}" != "1" ]; then
  # No MPI here: OpenMPI's own allocations would be LeakSanitizer reports;
  # kvcheck's MPI glue is the Release tree's (its mpi test there), and the
  # sharded path it drives is tested here too, without mpirun.
  cmake -S . -B build-asan -G "$(generator_for build-asan)" -DCMAKE_BUILD_TYPE=Debug -DKVCHECK_SANITIZE=ON "$unity" \
        -DKVCHECK_CUDA=OFF -DKVCHECK_BENCH=OFF -DKVCHECK_MPI=OFF
  cmake --build build-asan -j"$build_jobs"
  # The sanitizer run skips the tests whose cost is a long loop or a Python
  # process the Release run above already ran, each of whose C++ paths a
  # shorter test here also takes: the 2000-case fault and adapter-bug
  # sweeps, the full sweep grid, the 100,000-row runs, the production
  # profile through the CLI (properties_test's 40 production cases stay),
  # 2000 adapter cases and their byte-identity twin, an adapter checked
  # --against its bug switch (properties_test's side-by-side cases stay),
  # the output-only live
  # sweep, the Python protocol tests (pure Python) and schema traffic, the
  # three-shard merge test (properties_test merges shards in process) and
  # the shape-space test (the hello's checks: engines_test); the report
  # set's full-disk and concurrent-run cases (the atomic writer:
  # support_test), the usage and --help text (its table: cli_flags_test),
  # the production-shape draws and their all-MPFR comparison (the 4
  # production cases and the 113- and 169-bit comparisons stay); the
  # Python drivers of the report counts, the misbehaving adapter and the
  # reproduce labels (their C++ paths: counts_test and reports_test, the
  # hostile-adapter test, properties_test's reproduce cases); the Python
  # package's venv install and pytest suite (its C++ path: the exec tests);
  # the JSON-against-binary-frames report identity (its C++ path:
  # engines_test's ExecFrames cases); the Python driver of issue 30's
  # answers (begin events, impossible slots, crashes side by side, failing
  # seeds: its C++ paths are properties_test's audit, side-by-side and
  # counts cases and engines_test's ExecAnswer case); the CLI's bf16 output
  # format through the adapter (check_test's bitwise and engines_test's
  # runner cases of output formats), --max-failures through the CLI and the
  # CLI's byte-identical reports (properties_test's --max-failures case and
  # its 1-and-2-thread identity). Under ASan
  # they cost ~12 minutes of CI's 25.
  release_only=(
    'every named fault fails check at 2000'
    'full default grid'
    '100000-row'
    'RoPE angles formed in float32'
    'every adapter bug switch'
    'check --against an adapter'
    'check --profile production runs production cases'
    'an output-only ring adapter has the slot-reporting'
    'the bundled ring and paged adapters pass 2000 cases'
    'same seed, same adapter, same report bytes'
    'adapters: protocol unit tests'
    'real traffic validates against the schema'
    'shards: 3 shards merged'
    'exec shapes: strict hello'
    'reports: one set or nothing'
    'COMMAND --help prints'
    'production cases draw production shapes'
    'on production shapes'
    'reports: counts in every report'
    'a misbehaving adapter ends the run'
    'reproduce: a failure that passes alone'
    'python: pip install ./python'
    'binary frames and JSON text give the same report bytes'
    'exec answers: begin events judged'
    'a declared bf16 output format'
    'CLI: --max-failures stops'
    'CLI: the same seed gives byte-identical reports'
  )
  exclude=$(IFS='|'; echo "${release_only[*]}")
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -E "$exclude"
fi
