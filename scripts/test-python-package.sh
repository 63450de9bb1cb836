#!/usr/bin/env bash
# The kvcheck Python package as a user gets it: a fresh virtual environment
# (Debian's python3 with its site packages: numpy, pytest, hypothesis,
# torch), `pip install` of python/ offline, then the package's pytest suite
# (python/tests, python/examples: the toy cache, the planted bug, the torch
# example) against the kvcheck executable given. Usage:
#   scripts/test-python-package.sh BUILD/cli/kvcheck
set -euo pipefail
kvcheck=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-python.XXXXXX")
trap 'rm -rf "$work"' EXIT
# No pip inside the venv (ensurepip costs ~8 s): Debian's pip, reached
# through the system site packages, installs into the venv all the same.
/usr/bin/python3 -m venv --system-site-packages --without-pip "$work/venv"
# pip builds in the folder it installs from (build/, *.egg-info): a copy
# keeps the checkout clean and lets concurrent runs not meet.
cp -r "$src/python" "$work/src"
rm -rf "$work/src/build" "$work/src"/*.egg-info
"$work/venv/bin/python" -m pip install --quiet --no-index --no-build-isolation "$work/src"
cd "$work"  # not the copy: `import kvcheck` must find the installed package
"$work/venv/bin/python" - <<'PY'
import os, kvcheck
assert "site-packages" in kvcheck.__file__, kvcheck.__file__
PY
exec "$work/venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp "$work/tmp" \
     --kvcheck-binary="$kvcheck" "$work/src/tests" "$work/src/examples"
