#!/usr/bin/env bash
# Runs the libFuzzer harnesses of tests/fuzz (one per io reader) for SECONDS each, FUZZ_PARALLEL
# (default: nproc) at a time, under ASan + UBSan. Builds them first in build-asan/ with clang
# (-DTALLY_FUZZ=ON).
#
#   scripts/fuzz.sh                    20 s per reader: the smoke run scripts/test.sh does in CI
#   scripts/fuzz.sh 600                10 minutes per reader
#   scripts/fuzz.sh 3600 checkpoint    one hour on the checkpoint reader alone
#
# Readers: safetensors checkpoint hf_config cluster calibration (default: all), and cli: not a
# reader but the planner's commands, run by scripts/fuzz_cli.py with random flags and values for
# the same SECONDS (crashes, sanitizer reports, nan/inf, bad JSON, errors of more than one line,
# runs past 60 s or 4 GiB); a finding there is printed as the command line to rerun.
# The corpus each run grows is kept in build-asan/fuzz-corpus/<reader>/, so longer runs build on
# earlier ones; it starts from the seeds fuzz_make_seeds writes (tally's own writer and the fixtures
# of tests/io/data) and from tests/fuzz/regressions/<reader>/.
#
# A finding (crash, sanitizer report, leak, timeout, out-of-memory, or a broken harness check) is
# saved under build-asan/fuzz-findings/<reader>/; the script runs the remaining readers, then prints
# each finding and exits 1. To keep one as a regression test:
#   cp build-asan/fuzz-findings/<reader>/crash-<sha1> tests/fuzz/regressions/<reader>/<what-it-is>
# ctest then replays it (fuzz_replay_<reader>) in every build.
#
# Environment: BUILD_DIR (build-asan), FUZZ_CXX (clang++-14), JOBS (ninja jobs, nproc), FUZZ_PARALLEL
# (readers fuzzed at once, nproc), FUZZ_ARGS
# (extra libFuzzer flags: "-fork=2" runs two processes at once, "-seed=1" fixes the random seed).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${1:-20}
shift || true
READERS=("$@")
[ ${#READERS[@]} -gt 0 ] || READERS=(safetensors checkpoint hf_config cluster calibration cli)
BUILD_DIR=${BUILD_DIR:-build-asan}
FUZZ_CXX=${FUZZ_CXX:-clang++-14}
JOBS=${JOBS:-$(nproc)}

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_CXX_COMPILER="$FUZZ_CXX" -DTALLY_FUZZ=ON >/dev/null
targets=(fuzz_make_seeds)
for r in "${READERS[@]}"; do
  if [ "$r" = cli ]; then targets+=(tally); else targets+=("fuzz_$r"); fi
done
ninja -C "$BUILD_DIR" -j "$JOBS" "${targets[@]}"

seeds="$BUILD_DIR/fuzz-seeds"
"$BUILD_DIR/tests/fuzz/fuzz_make_seeds" "$seeds" >/dev/null

# The harnesses write every input to files (and the checkpoint writer fsyncs): a RAM disk keeps that
# cheap. Each harness process uses <TMPDIR>/tally_fuzz_<pid>.
scratch_root=/dev/shm
[ -d "$scratch_root" ] && [ -w "$scratch_root" ] || scratch_root="$BUILD_DIR"
scratch=$(mktemp -d "$scratch_root/tally-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# One reader's run; its one-line result goes to $BUILD_DIR/fuzz-<reader>.result.
fuzz_one() {
  local r=$1 corpus="$BUILD_DIR/fuzz-corpus/$1" findings="$BUILD_DIR/fuzz-findings/$1"
  local log="$BUILD_DIR/fuzz-$1.log" result="$BUILD_DIR/fuzz-$1.result" runs cov
  mkdir -p "$corpus" "$findings"
  if [ "$r" = cli ]; then
    if python3 scripts/fuzz_cli.py "$BUILD_DIR/cli/tally" "$SECONDS_EACH" >"$log" 2>&1; then
      echo "fuzz cli: $(tail -n 1 "$log" | sed 's/^fuzz_cli: //')" >"$result"
    else
      echo "FINDING" >"$result"
    fi
    return
  fi
  # -timeout: one input may take at most 30 s (a valid one takes milliseconds, even on a loaded CI
  # machine). -malloc_limit_mb: one allocation of 1 GiB or more is a finding, as in the replay tests
  # (replay_main.cpp): the inputs are a few KiB, so a reader asking for that much has trusted a size
  # it read instead of what the file holds. -rss_limit_mb: 2 GiB in all.
  # shellcheck disable=SC2086
  if TMPDIR="$scratch" "$BUILD_DIR/tests/fuzz/fuzz_$r" \
      -max_total_time="$SECONDS_EACH" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -dict=tests/fuzz/json.dict -artifact_prefix="$findings/" -print_final_stats=1 \
      ${FUZZ_ARGS:-} "$corpus" "$seeds/$r" "tests/fuzz/regressions/$r" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    [ -n "$runs" ] || runs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')  # -fork=N
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz $r: ${SECONDS_EACH} s, ${runs:-?} inputs, ${cov:-cov: ?}, no finding" >"$result"
  else
    echo "FINDING" >"$result"
  fi
}

# FUZZ_PARALLEL readers at a time (default: one per core; each harness is one process, so on CI's
# two cores the five 20-s runs take 60 s, not 100, and each reader still gets its SECONDS).
parallel=${FUZZ_PARALLEL:-$(nproc)}
running=0
for r in "${READERS[@]}"; do
  rm -f "$BUILD_DIR/fuzz-$r.result"
  fuzz_one "$r" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=()
for r in "${READERS[@]}"; do
  result="$BUILD_DIR/fuzz-$r.result"
  if [ -f "$result" ] && [ "$(cat "$result")" != FINDING ]; then
    cat "$result"
  else
    echo "fuzz $r: FINDING (log: $BUILD_DIR/fuzz-$r.log); its end:"
    tail -n 40 "$BUILD_DIR/fuzz-$r.log" | sed 's/^/  /'
    failed+=("$r")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}: the inputs are in $BUILD_DIR/fuzz-findings/<reader>/;"
  echo "  reproduce: $BUILD_DIR/tests/fuzz/fuzz_<reader> $BUILD_DIR/fuzz-findings/<reader>/<file>"
  echo "  then keep each as tests/fuzz/regressions/<reader>/<what-it-is> (tests/fuzz/regressions/README.md)"
  echo "  cli: rerun the command line its log prints, and keep it as a test in tests/cli"
  exit 1
fi
