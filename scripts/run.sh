#!/usr/bin/env bash
# A newcomer's first command: install packages, build, and run tally's main job on the built-in
# default scenario (the seed's 7B on 8 × 80 GB GPUs). Extra arguments go to `tally plan`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh tally   # only what the main job needs; tests and benchmarks come with scripts/test.sh
exec ./build/cli/tally plan "$@"
