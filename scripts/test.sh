#!/usr/bin/env bash
# Install packages, build everything, run every test (unit, multi-process engine, CLI); then the
# core, io and cli tests again under AddressSanitizer + UBSan, and a short fuzzing run of every io
# reader. This is exactly what .ci/run runs. Each phase prints its elapsed time.
#
#   build/        the project as users build it, warnings as errors (-DTALLY_WERROR=ON); all tests
#   build-asan/   clang 14, -DTALLY_FUZZ=ON (ASan + UBSan, and libFuzzer's coverage): core, io, cli
#                 and their tests (no engine: libtorch is not built with ASan), any sanitizer report
#                 aborting the test that hit it; then scripts/fuzz.sh runs each io reader's libFuzzer
#                 harness from the same build for FUZZ_SECONDS (default 20) seconds
#                 (`scripts/fuzz.sh 600` fuzzes longer). One sanitizer build serves both: on CI's
#                 two cores a second one cost minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export JOBS=${JOBS:-$(nproc)}
start=$SECONDS
phase() { echo "== test.sh: $1 done at $((SECONDS - start)) s"; }

bash scripts/install-deps.sh
phase "install-deps"

TALLY_CMAKE_ARGS="-DTALLY_WERROR=ON" bash scripts/build.sh
phase "build/"
(cd build && ctest --output-on-failure --timeout 300 -j "$JOBS")
phase "build/ tests"

# An older build-asan/ configured with g++ is rebuilt with clang.
if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang' build-asan/CMakeCache.txt; then
  rm -rf build-asan
fi
BUILD_DIR=build-asan TALLY_CMAKE_ARGS="-DCMAKE_CXX_COMPILER=clang++-14 -DTALLY_FUZZ=ON" \
  bash scripts/build.sh
phase "build-asan/"
(cd build-asan &&
  ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --timeout 300 -j "$JOBS")
phase "build-asan/ tests"

BUILD_DIR=build-asan bash scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
phase "fuzzing"
