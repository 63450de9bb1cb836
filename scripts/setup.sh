#!/usr/bin/env bash
# Installs the Debian packages kvcheck builds with, only those that are
# missing; does nothing (and needs no network) when all are present.
# OpenMPI and Boost.MPI are optional for the build (`mpirun -n R kvcheck
# check`); they are installed so that its test runs. libxml2-utils (xmllint)
# and python3-jsonschema are the parsers the report tests judge files with.
# gcovr reports the line coverage of scripts/coverage.sh. libcli11-dev is the
# CLI's argument parser (header-only). The Python package's test (python/)
# installs it with python3-venv and python3-pip, offline, and runs pytest
# over numpy and the PyTorch example (python3-torch).
set -euo pipefail

packages=(cmake g++ make ninja-build librapidcheck-dev catch2 nlohmann-json3-dev libboost-dev
          libmpfr-dev libgmp-dev libbenchmark-dev python3 python3-jsonschema
          libxml2-utils libcli11-dev openmpi-bin libopenmpi-dev libboost-mpi-dev gcovr
          python3-numpy python3-pytest python3-hypothesis python3-torch python3-venv python3-pip)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "kvcheck setup: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
