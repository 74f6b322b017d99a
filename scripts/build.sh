#!/usr/bin/env bash
# Configures and builds tally into build/ (Release-with-debug-info, Ninja). Idempotent.
# Arguments are ninja targets (default: everything), e.g. `scripts/build.sh tally`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja ${TALLY_CMAKE_ARGS:-} >/dev/null
ninja -C "$BUILD_DIR" -j "$JOBS" "$@"
