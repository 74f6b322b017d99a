#!/usr/bin/env bash
# Issue 3's performance items, measured in one run on this host:
#   1. tally's data-parallel step time vs PyTorch's DistributedDataParallel (Debian python3-torch,
#      /usr/bin/python3, ranks started by `tally launch` with torchrun's environment variables),
#      same model, batch, world size, threads per rank, bucket size and Gloo backend, as the ratio
#      tally/PyTorch of the median step time (< 1: tally is faster; the goal is <= 1);
#   2. tally's ring vs Gloo's all-reduce busbw at 64 MB, as a ratio (`tally bench allreduce`).
# Correctness in the same run: both sides print the final loss and parameter checksums of the
# same training (engine/bench tally/engine/bench/ddp.hpp, step 7), compared in the table.
#
# Builds nothing. Usage:
#   bench/ddp_vs_pytorch.sh BUILD_DIR [-k "2 4"] [-r ROUNDS] [-- flags for both sides]
# e.g. bench/ddp_vs_pytorch.sh build -k "2 4" -r 5 -- --optimizer adam --lr 1e-3
#
# Method: for each world size, ROUNDS rounds, each running tally then PyTorch (the order swaps
# every round, so drift in the machine's load hits both alike). Every run does W warm-up and S
# timed steps; a step's time is its slowest rank's. Per side, the table pools the timed steps of
# all rounds: median, p10, p90 in ms. ratio = tally median / PyTorch median; "per-round" gives the
# min and max over rounds of the same ratio from that round's two runs, the spread of the verdict.
# Both sides get the same OPENBLAS_NUM_THREADS / OMP_NUM_THREADS as --threads (default 1), so the
# BLAS's own pool cannot give one side more cores than the other.
set -euo pipefail

usage() { sed -n '11,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
BUILD=$1; shift
WORLD_SIZES="2"
ROUNDS=3
while [[ $# -gt 0 ]]; do
  case $1 in
    -k) WORLD_SIZES=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
FLAGS=("$@")

HERE=$(cd "$(dirname "$0")" && pwd)
TALLY=$BUILD/cli/tally
PY=/usr/bin/python3
PEER=$HERE/ddp_peer.py
[[ -x $TALLY ]] || { echo "no tally binary at $TALLY (build it first)" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { echo "$PY cannot import torch (apt install python3-torch)" >&2; exit 2; }

THREADS=1
for ((i = 0; i < ${#FLAGS[@]}; ++i)); do
  [[ ${FLAGS[$i]} == --threads ]] && THREADS=${FLAGS[$((i + 1))]}
done
export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS

OUT=$(mktemp -d /tmp/ddp_vs_pytorch.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

# Rank 0's output (its JSON, one line or pretty-printed), "[rank 0] " prefixes stripped, into $1.
run_json() {
  local dest=$1; shift
  if ! "$@" >"$dest.log" 2>&1; then
    echo "FAILED: $*" >&2; cat "$dest.log" >&2; exit 1
  fi
  grep '^\[rank 0\] ' "$dest.log" | sed 's/^\[rank 0\] //' >"$dest"
}

echo "# ddp_vs_pytorch: $(date -u +%FT%TZ) on $(hostname), $(getconf _NPROCESSORS_ONLN) CPUs; load average at start:$(uptime | sed 's/.*load average://')"
echo "# flags for both sides: --json ${FLAGS[*]:-} (OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=$THREADS)"
for k in $WORLD_SIZES; do
  for ((r = 1; r <= ROUNDS; ++r)); do
    tally_run() { run_json "$OUT/tally_k${k}_r$r.json" "$TALLY" launch --nproc "$k" --timeout 300 -- \
                    "$TALLY" bench ddp --json "${FLAGS[@]}"; }
    torch_run() { run_json "$OUT/torch_k${k}_r$r.json" "$TALLY" launch --nproc "$k" --timeout 300 -- \
                    "$PY" "$PEER" --json "${FLAGS[@]}"; }
    if ((r % 2)); then tally_run; torch_run; else torch_run; tally_run; fi
  done
  run_json "$OUT/allreduce_k$k.json" "$TALLY" launch --nproc "$k" --timeout 300 -- \
    "$TALLY" bench allreduce --sizes-mb 64 --warmup 2 --iters 10 --json
done
LOAD_END=$(uptime | sed 's/.*load average://')

"$PY" - "$OUT" "$ROUNDS" "$WORLD_SIZES" "$LOAD_END" <<'EOF'
import json, math, sys
out, rounds, sizes, load_end = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]

def quantile(s, q):  # numpy's linear default, as engine/bench harness.hpp
    s = sorted(s); h = q * (len(s) - 1); lo = int(math.floor(h))
    return s[-1] if lo + 1 >= len(s) else s[lo] + (h - lo) * (s[lo + 1] - s[lo])

def load(name):
    with open(f"{out}/{name}") as f:
        return json.loads(f.read())

worst = 0.0
first = load(f"tally_k{sizes[0]}_r1.json")
print(f"# model: MLP widths {first['widths']} ({first['parameters']:,} parameters, float32), "
      f"B = {first['batch_per_rank']}/rank, {first['optimizer']} lr {first['lr']}, bucket "
      f"{first['bucket_cap_mb']:g} MiB (first {first['first_bucket_mb']:g} MiB), {first['threads']} thread(s)/rank, "
      f"{first['warmup_steps']} warm-up + {first['steps']} timed steps x {rounds} rounds per side")
print("# step = forward + backward + gradient sync + optimizer step, slowest rank; ms over all "
      "rounds' timed steps; ratio = tally/PyTorch median (< 1: tally faster)")
print(f"# {'k':>2} {'side':>7} {'median_ms':>9} {'p10_ms':>8} {'p90_ms':>8} {'samples/s':>10}  "
      f"{'ratio':>6} {'per-round':>13}  {'final_loss':>12} {'param_sum':>20}  agree  "
      f"ring/gloo@64MB")
for k in sizes:
    sides = {}
    for side in ("tally", "torch"):
        runs = [load(f"{side}_k{k}_r{r}.json") for r in range(1, rounds + 1)]
        steps = [t for j in runs for t in j["step_times_s"]]
        sides[side] = dict(runs=runs, med=quantile(steps, 0.5), p10=quantile(steps, 0.1),
                           p90=quantile(steps, 0.9))
    t, p = sides["tally"], sides["torch"]
    ratio = t["med"] / p["med"]
    per_round = [a["step_time_s"]["median"] / b["step_time_s"]["median"]
                 for a, b in zip(t["runs"], p["runs"])]
    worst = max(worst, ratio)
    # Every run of a side trains identically; compare tally's with PyTorch's.
    keys = ("final_loss", "param_sum", "param_abs_sum")
    exact = all(a[key] == b[key] for a in t["runs"] for b in p["runs"] for key in keys)
    rel = max(abs(a[key] - b[key]) / max(1.0, abs(b[key]))
              for a in t["runs"] for b in p["runs"] for key in keys)
    agree = "exact" if exact else ("1e-6" if rel < 1e-6 else f"NO({rel:.1e})")
    ar = load(f"allreduce_k{k}.json")["ring_over_gloo_busbw"]
    for side, name in (("tally", "tally"), ("torch", "pytorch")):
        s, j = sides[side], sides[side]["runs"][0]
        glob = j["batch_per_rank"] * j["world_size"]
        mid = (f"{ratio:6.3f} {min(per_round):6.3f}-{max(per_round):6.3f}" if side == "tally"
               else " " * 20)
        tail = f"{agree:>5}  {ar:.3f}" if side == "tally" else ""
        print(f"  {k:>2} {name:>7} {s['med']*1e3:9.2f} {s['p10']*1e3:8.2f} {s['p90']*1e3:8.2f} "
              f"{glob / s['med']:10.1f}  {mid}  {j['final_loss']:12.9g} {j['param_sum']:20.15g}  "
              f"{tail}")
print(f"# load average at end:{load_end}")
print(f"# verdict: tally/PyTorch step time {'<= 1 (tally no slower)' if worst <= 1 else '> 1 (tally SLOWER)'}: "
      f"worst ratio {worst:.3f}")
EOF
