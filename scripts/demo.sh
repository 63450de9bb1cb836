#!/usr/bin/env bash
# The main job on bundled defaults: set up, build, then `kvcheck demo`
# (the golden values from the reference model, the bundled scenarios replayed on the CPU
# backend, a randomized check, and kvcheck-out/report.html).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs" --target kvcheck >/dev/null
exec build/cli/kvcheck demo "$@"
