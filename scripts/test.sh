#!/usr/bin/env bash
# Install packages, build everything, run every test (unit, multi-process engine, CLI). This is
# exactly what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 300 -j "${JOBS:-$(nproc)}"
