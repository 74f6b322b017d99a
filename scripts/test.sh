#!/usr/bin/env bash
# Install packages, build everything, run every test (unit, multi-process engine, CLI); then the
# core, io and cli tests again under AddressSanitizer + UBSan, and a short fuzzing run of every io
# reader. This is exactly what .ci/run runs.
#
#   build/        the project as users build it, warnings as errors (-DTALLY_WERROR=ON); all tests
#   build-asan/   -DTALLY_SANITIZE=ON: core, io, cli and their tests (no engine: libtorch is not
#                 built with ASan); any sanitizer report aborts the test that hit it
#   build-fuzz/   -DTALLY_FUZZ=ON (clang): scripts/fuzz.sh runs each io reader's libFuzzer harness
#                 for FUZZ_SECONDS (default 20) seconds; `scripts/fuzz.sh 600` fuzzes longer
set -euo pipefail
cd "$(dirname "$0")/.."
export JOBS=${JOBS:-$(nproc)}
bash scripts/install-deps.sh

TALLY_CMAKE_ARGS="-DTALLY_WERROR=ON" bash scripts/build.sh
(cd build && ctest --output-on-failure --timeout 300 -j "$JOBS")

BUILD_DIR=build-asan TALLY_CMAKE_ARGS="-DTALLY_SANITIZE=ON" bash scripts/build.sh
(cd build-asan &&
  ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --timeout 300 -j "$JOBS")

bash scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
