#!/usr/bin/env bash
# Issue 10's loop closed on this host: calibrate, predict the engine's own runs with the operator
# model (core/mlp_step.hpp, Note [host step model]), run them, print measured / predicted.
#
# Builds nothing. Usage:
#   bench/predict_vs_measured.sh BUILD_DIR [-k "1 2 4"] [-o OUT_DIR] [-r ROUNDS] [-b BUSY_MS]
#
# 1. Per round, calibrate, in OUT_DIR (default a new temporary directory):
#      tally bench gemm   --calibration-out cal-r<r>.json   float32 at::mm over the default grid,
#                                                      each call after a cache flush (its default:
#                                                      Note [cold-cache GEMMs], bench/kernels.hpp)
#      tally bench gemm --batch 8,16 --m/--n/--k 32,64,128  the batched products the GPT's
#                                                      attention makes (B·a' = 8 or 16 heads of
#                                                      T = 128 or ring blocks of 32, d = 64),
#                                                      merged into the same file: a calibration
#                                                      prices a GEMM on the measured GEMMs of its
#                                                      kind, single or batched (Note [GEMM
#                                                      residuals], core/roofline.hpp)
#      tally bench memory --calibration-out cal-r<r>.json   a.add_(b) bandwidth by working set,
#                                                      and the GPT's streaming kernel families
#                                                      (Note [streaming kernel families])
#      then per k >= 2 a copy cal-k<k>-r<r>.json plus
#      tally launch --nproc k -- tally bench allreduce --algo both --sizes-mb $SIZES --iters 50
#        --busy-ms BUSY_MS   (default 2: each call after 2 ms of busy CPU, as a step makes it —
#                             Note [busy before a call]; -b 0 times the calls back to back)
#        --overlap-probe     (how much of Gloo's all-reduce this host hides behind CPU work:
#                             its σ, which bench ddp's overlapped buckets are priced with —
#                             Note [host overlap] in engine/bench/allreduce.cpp)
#        --sharded           (each size also as ZeRO's halves, tally's ring reduce-scatter and
#                             Gloo's all-gather, as run zero calls them: a call after compute
#                             pays its fixed cost whole, not half — Note [sharded collectives];
#                             neither probe runs where the ranks outnumber the cores)
#      (both implementations at that k over the runs' own message sizes, SIZES below, each size
#      timed with both in turn): each run refits α–β from the points of the implementation each
#      of its collectives calls (Note [per-implementation links], core/mlp_step.hpp) — bench
#      ddp's reducer Gloo's all-reduce; run zero tally's ring for DP's all-reduce and the ZeRO
#      stages' reduce-scatter, Gloo's for their all-gathers (engine/runtime/comm.cpp).
#      The halves are priced on their own points where --sharded timed them.
#    Nothing is fitted to the runs below: the calibration is kernels and collectives only.
# 2. Then per k: `tally bench ddp` (DDP, SGD, bench's default MLP, B 32 per rank) and
#    `tally run zero` (ZeRO-0/1/2/3, Adam, the default ZeRO MLP, 64 rows over k ranks), each with
#    --calibration cal-k<k>-r<r>.json --json; and `tally run 3d` (the engine's GPT, h 256,
#    a 4, L 4, V 512, T 128, B 4, fp32 Adam, 6 steps timed by their medians over steps 2-6: Note
#    [3-D step times] in engine/experiments/three_d.cpp; Note [host GPT step] in
#    core/gpt_step.hpp) in the layouts of THREE_D below whose rank count is k, on the same
#    file's link, Gloo's fit (its TP and DP all-reduces and all-gathers are Gloo's; none of
#    THREE_D runs ZeRO's ring).
# 3. A markdown table: run, k, measured median step (ms), predicted (ms), measured/predicted, and
#    the prediction's terms. Rounds pool by taking the median ratio over rounds, printed beside
#    the rounds' own min-max. Then each run's phases (rank 0's medians: bench ddp
#    forward+backward / sync wait / optimizer, run zero forward+backward / collectives /
#    optimizer) beside the model's matching terms. With -r ≥ 2, how far the VM's kernels moved
#    between the rounds' calibrations (GEMM time over the grid, DRAM bandwidth, round r / round
#    1), and the rounds' spread: each run outside ±15 % with its rounds' ratios and how many of
#    those have a round inside, and how far each run's rounds lay apart (max/min − 1, median
#    and largest) — the same run calibrated afresh minutes apart, this VM's noise floor, against
#    which a pooled ratio a point or two past the band says little.
# OPENBLAS_NUM_THREADS=1 and one torch thread per rank throughout (the runs' default).
set -euo pipefail

usage() { sed -n '5,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
BUILD=$1; shift
WORLD_SIZES="1 2 4"
OUT=""
ROUNDS=1
BUSY_MS=2
while [[ $# -gt 0 ]]; do
  case $1 in
    -k) WORLD_SIZES=$2; shift 2 ;;
    -o) OUT=$2; shift 2 ;;
    -r) ROUNDS=$2; shift 2 ;;
    -b) BUSY_MS=$2; shift 2 ;;
    *) usage ;;
  esac
done
TALLY=$(cd "$BUILD" && pwd)/cli/tally
[[ -x $TALLY ]] || { echo "no $TALLY: build first (scripts/build.sh tally tally-engine)" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d)}
# run 3d: name:ranks:flags
THREE_D=("single:1:" "tp2:2:--tp 2" "tp2-sp:2:--tp 2 --sp" "cp2:2:--cp 2" "pp2:2:--pp 2"
         "dp2:2:--dp 2" "tp2-pp2:4:--tp 2 --pp 2"
         "dp2-tp2:4:--dp 2 --tp 2")
# The collectives' sizes the runs send, MB: run zero's MLP (N = 1,577,455 fp32) as one 6.31 MB
# gradient (DP's all-reduce, ZeRO-1/2's reduce-scatter and all-gather) or per unit, ZeRO-3's 2.10,
# 4.17 and 0.041 MB; bench ddp's MLP (2,640,912 fp32, 10.56 MB) in PyTorch's buckets, the first
# closed at 1 MiB; plus 0.25 and 16 MB at the ends. Fitting α–β over these (2026-12-04, k = 2:
# 6.3 MB at 5.9–6.3 ms) instead of 0.25, 1, 4, 16 MB alone (5.3–5.5 ms; the bench itself measures
# 6.0–6.7 ms there) prices the runs' messages as measured, not as a curve's far points imply.
SIZES=0.041,0.25,1,2.1,4.17,6.31,10.56,16
GPT=(--hidden 256 --heads 4 --layers 4 --vocab 512 --seq 128 --micro-batch 4 --steps 6)
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# Each round calibrates afresh, just before its runs: this VM's kernels drift by a fifth to a third
# within minutes, so one calibration for all rounds would bias every ratio alike; the median over
# rounds is then over independent calibrate-then-run pairs.
calibrate() {  # $1 = round
  local cal="$OUT/cal-r$1.json"
  rm -f "$cal"
  "$TALLY" bench gemm --calibration-out "$cal" >"$OUT/gemm-r$1.txt"
  "$TALLY" bench gemm --batch 8,16 --m 32,64,128 --n 32,64,128 --k 32,64,128 \
    --calibration-out "$cal" >"$OUT/gemm-batched-r$1.txt"
  "$TALLY" bench memory --calibration-out "$cal" >"$OUT/memory-r$1.txt"
  for k in $WORLD_SIZES; do
    cp "$cal" "$OUT/cal-k$k-r$1.json"
    if [[ $k -ge 2 ]]; then
      "$TALLY" launch --nproc "$k" -- "$TALLY" bench allreduce --algo both \
        --sizes-mb "$SIZES" --iters 50 --busy-ms "$BUSY_MS" --overlap-probe --sharded \
        --calibration-out "$OUT/cal-k$k-r$1.json" >"$OUT/allreduce-k$k-r$1.txt"
    fi
  done
}

for r in $(seq 1 "$ROUNDS"); do
  echo "# round $r: calibrating in $OUT" >&2
  calibrate "$r"
  for k in $WORLD_SIZES; do
    echo "# round $r, k = $k" >&2
    "$TALLY" launch --nproc "$k" -- "$TALLY" bench ddp --calibration "$OUT/cal-k$k-r$r.json" \
      --json | sed -n 's/^\[rank 0\] //p' >"$OUT/ddp-k$k-r$r.json"
    "$TALLY" launch --nproc "$k" -- "$TALLY" run zero --calibration "$OUT/cal-k$k-r$r.json" --json \
      | sed -n 's/^\[rank 0\] //p' >"$OUT/zero-k$k-r$r.json"
    for layout in "${THREE_D[@]}"; do
      IFS=: read -r name ranks flags <<<"$layout"
      [[ $ranks == "$k" ]] || continue
      # shellcheck disable=SC2086  # flags is a word list
      "$TALLY" launch --nproc "$k" -- "$TALLY" run 3d $flags "${GPT[@]}" \
        --calibration "$OUT/cal-k$k-r$r.json" --json 2>/dev/null \
        | sed -n 's/^\[rank 0\] //p' >"$OUT/3d-$name-r$r.json"
    done
  done
done

THREE_D_NAMES=""
for layout in "${THREE_D[@]}"; do
  IFS=: read -r name ranks _ <<<"$layout"
  [[ " $WORLD_SIZES " == *" $ranks "* ]] && THREE_D_NAMES+="$name:$ranks "
done

python3 - "$OUT" "$WORLD_SIZES" "$ROUNDS" "$THREE_D_NAMES" <<'EOF'
import json, os, statistics, sys
out, ks, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
three_d = [x.split(":") for x in sys.argv[4].split()]
rows, phases, zero_phases = [], [], []
spreads = []  # (run, k, pooled ratio, each round's ratio)
lohi = lambda v: f"{min(v):.2f}-{max(v):.2f}"
def row(name, k, runs):
    m = statistics.median(x["measured"] for x in runs)
    p = statistics.median(x["predicted"] for x in runs)
    q = statistics.median(x["ratio"] for x in runs)
    t = runs[0]["terms"]
    rows.append((name, k, m, p, q, t))
    spreads.append((name, k, q, [x["ratio"] for x in runs]))
for k in ks:
    ddp, zero = [], {}
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/ddp-k{k}-r{r}.json"))
        ddp.append({"measured": d["step_time_s"]["median"], "predicted": d["predicted_step_seconds"],
                    "ratio": d["measured_over_predicted"], "terms": d["prediction"],
                    "phases": d["phase_seconds_median"]})
        z = json.load(open(f"{out}/zero-k{k}-r{r}.json"))
        for st in z["stages"]:
            zero.setdefault(st["name"], []).append(
                {"measured": st["step_seconds_median"], "predicted": st["predicted_step_seconds"],
                 "ratio": st["measured_over_predicted"], "terms": st["prediction"],
                 "phases": st["phase_seconds_median"], "ranks": st["ranks"]})
    row("bench ddp (SGD)", k, ddp)
    phases.append((k, ddp))
    for name, runs in zero.items():
        row(f"run zero {name}", k, runs)
        zero_phases.append((k, name, runs))
print("| run | k | measured ms | predicted ms | measured/predicted | rounds' min-max | compute | "
      "grad passes | optimizer | comm exposed (all) | contention |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (name, k, m, p, q, t), (*_, each) in zip(rows, spreads):
    print(f"| {name} | {k} | {m*1e3:.2f} | {p*1e3:.2f} | {q:.3f} | {lohi(each)} | "
          f"{t['compute_s']*1e3:.2f} | "
          f"{t['gradient_passes_s']*1e3:.2f} | {t['optimizer_s']*1e3:.2f} | "
          f"{t['comm_exposed_s']*1e3:.2f} ({t['comm_s']*1e3:.2f}) | {t['contention']:g} |")
print("\nbench ddp by phase (rank 0's own medians; both sides pooled over rounds by the median), ms: "
      "measured / predicted")
print("| k | forward+backward / contention x (compute + grad passes) | sync wait / exposed comm (all) | optimizer / contention x optimizer |")
print("|---|---|---|---|")
# The predicted side of the phase tables pools each term over the rounds by the median, as the
# measured side does (one round's calibration can drift: a round's DRAM figure 24 % low priced
# the optimizer at 1.3-1.5× what ran, 2026-12-07 11:30).
def pooled_terms(runs):
    keys = ("compute_s", "gradient_passes_s", "optimizer_s", "comm_s", "comm_exposed_s",
            "contention")
    return {key: statistics.median(x["terms"][key] for x in runs) for key in keys}
for k, runs in phases:
    med = lambda key: statistics.median(x["phases"][key] for x in runs) * 1e3
    t = pooled_terms(runs)
    c = t["contention"]
    print(f"| {k} | {med('forward_backward'):.2f} / {c*(t['compute_s']+t['gradient_passes_s'])*1e3:.2f} | "
          f"{med('sync_wait'):.2f} / {t['comm_exposed_s']*1e3:.2f} ({t['comm_s']*1e3:.2f}) | "
          f"{med('optimizer'):.2f} / {c*t['optimizer_s']*1e3:.2f} |")
print("\nrun zero by phase (rank 0's own medians over the steps; both sides pooled over rounds by the "
      "median), ms: measured / predicted")
print("(arrival wait: time in collectives before the last rank entered, not modelled; collectives: "
      "the rest of their time)")
print("| k | stage | forward+backward / contention x (compute + grad passes) | arrival wait | collectives / comm | optimizer / contention x optimizer |")
print("|---|---|---|---|---|---|")
for k, name, runs in zero_phases:
    med = lambda key: statistics.median(x["phases"].get(key, 0.0) for x in runs) * 1e3
    t = pooled_terms(runs)
    c = t["contention"]
    print(f"| {k} | {name} | {med('forward_backward'):.2f} / {c*(t['compute_s']+t['gradient_passes_s'])*1e3:.2f} | "
          f"{med('arrival_wait'):.2f} | {med('collectives'):.2f} / {t['comm_s']*1e3:.2f} | "
          f"{med('optimizer'):.2f} / {c*t['optimizer_s']*1e3:.2f} |")
print("\nrun zero, every rank (round 1: min-max over the ranks' own medians, Note [every rank's "
      f"phases] in engine/experiments/zero.cpp; CPU: each rank's process, all threads; "
      f"{os.cpu_count()} cores), ms")
print("| k | stage | forward+backward | forward+backward + arrival wait | "
      "contention x (compute + grad passes) | CPU per step | "
      "cores busy: sum of CPU / (cores x step) | "
      "main thread's run-queue wait, mean per step (in collectives) |")
print("|---|---|---|---|---|---|---|---|")
span = lambda v: f"{min(v)*1e3:.2f}-{max(v)*1e3:.2f}"
for k, name, runs in zero_phases:
    ranks, t = runs[0]["ranks"], runs[0]["terms"]
    fb = [x["phase_seconds_median"]["forward_backward"] for x in ranks]
    wait = [x["phase_seconds_median"].get("arrival_wait", 0.0) for x in ranks]
    cpu = [x["cpu_seconds_median"] for x in ranks]
    busy = sum(cpu) / (os.cpu_count() * max(x["step_seconds_median"] for x in ranks))
    queued = [x["runqueue_wait_seconds_mean"] for x in ranks if "runqueue_wait_seconds_mean" in x]
    inside = [x.get("runqueue_wait_in_collectives_seconds_mean", 0.0) for x in ranks]
    queued_cell = f"{span(queued)} ({span(inside)})" if queued else "-"
    print(f"| {k} | {name} | {span(fb)} | {span([a + b for a, b in zip(fb, wait)])} | "
          f"{t['contention']*(t['compute_s']+t['gradient_passes_s'])*1e3:.2f} | {span(cpu)} | "
          f"{busy:.2f} | {queued_cell} |")
ratios = [q for *_, q, _ in rows]
if three_d:
    print("\nrun 3d (the engine's GPT; per run the slowest rank's step; core's parts on the rank "
          "with the largest prediction), ms: measured / predicted")
    print("| layout | k | measured ms | predicted ms | measured/predicted | rounds' min-max | "
          "compute | TP comm | "
          "CP comm | PP sends | DP comm | optimizer | compute measured (ranks' min-max) | "
          "TP comm measured (arrival wait) | DP comm measured (arrival wait) | "
          "main thread's run-queue wait per step, ranks' min-max (in TP and DP collectives) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
def queued_3d(ranks):  # Note [run-queue wait]: null where a rank could not read it
    q = [x.get("runqueue_wait_s") for x in ranks]
    inside = [x.get("runqueue_wait_in_collectives_s") for x in ranks]
    if any(v is None for v in q):
        return "-"
    cell = f"{min(q)*1e3:.1f}-{max(q)*1e3:.1f}"
    if all(v is not None for v in inside):
        cell += f" ({min(inside)*1e3:.1f}-{max(inside)*1e3:.1f})"
    return cell
for name, k in three_d:
    runs = []
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/3d-{name}-r{r}.json"))
        measured, predicted = d["measured_step_seconds"], d["predicted_step_seconds"]
        top = max(d["ranks"],
                  key=lambda x: x["compute_s"]["predicted"] + x["tp_comm_s"]["predicted"] +
                  x["cp_comm_s"]["predicted"])
        runs.append((measured, predicted, measured / predicted, top, d["ranks"]))
    m = statistics.median(x[0] for x in runs)
    p = statistics.median(x[1] for x in runs)
    q = statistics.median(x[2] for x in runs)
    t, ranks = runs[0][3], runs[0][4]  # the parts: round 1's
    ratios.append(q)
    spreads.append((f"run 3d {name}", k, q, [x[2] for x in runs]))
    print(f"| {name} | {k} | {m*1e3:.1f} | {p*1e3:.1f} | {q:.3f} | {lohi([x[2] for x in runs])} | "
          f"{t['compute_s']['predicted']*1e3:.1f} | {t['tp_comm_s']['predicted']*1e3:.1f} | "
          f"{t['cp_comm_s']['predicted']*1e3:.1f} | {t['pp_send_predicted_s']*1e3:.1f} | {t['dp_comm_s']['predicted']*1e3:.1f} | "
          f"{t['optimizer_time_s']['predicted']*1e3:.1f} | "
          f"{min(x['compute_s']['measured'] for x in ranks)*1e3:.1f}-"
          f"{max(x['compute_s']['measured'] for x in ranks)*1e3:.1f} | " +
          (f"{t['tp_comm_s']['measured']*1e3:.1f} ({t['tp_arrival_wait_s']*1e3:.1f})"
           if t.get("tp_arrival_wait_s") is not None else "-") + " | " +
          (f"{t['dp_comm_s']['measured']*1e3:.1f} ({t['dp_arrival_wait_s']*1e3:.1f})"
           if t.get("dp_arrival_wait_s") is not None else "-") + " | " + queued_3d(ranks) + " |")
# How far this VM's kernels moved between the rounds' calibrations (each round calibrates afresh,
# just before its runs): a report whose rounds disagree by more than its goal's ±15 % says more
# about the VM than about the model.
if rounds > 1:
    cals = [json.load(open(f"{out}/cal-r{r}.json"))["kernels"] for r in range(1, rounds + 1)]
    def gemm_times(c):
        return {(g["m"], g["n"], g["k"], g.get("batch", 1)): g["seconds_median"]
                for g in c["gemm"]}
    base = gemm_times(cals[0])
    drift = [statistics.median(t[s] / base[s] for s in base if s in t)
             for t in map(gemm_times, cals)]
    dram = [c["memory_bytes_per_s"] / cals[0]["memory_bytes_per_s"] for c in cals]
    print("\ncalibration drift between rounds (round r / round 1): GEMM time, median over the grid "
          + " / ".join(f"{x:.2f}" for x in drift) + "; DRAM add bandwidth "
          + " / ".join(f"{x:.2f}" for x in dram))
print(f"\nmedian |measured/predicted - 1| = {statistics.median(abs(q - 1) for q in ratios):.3f}; "
      f"within ±15 %: {sum(abs(q - 1) <= 0.15 for q in ratios)} of {len(ratios)}")
# A pooled ratio outside the band says little where the run's own rounds straddle it: the same
# run, calibrated afresh minutes apart, read on both sides (step 3 in the header).
outside = [(n, k, q, e) for n, k, q, e in spreads if abs(q - 1) > 0.15]
if outside and rounds > 1:
    inside = sum(any(abs(x - 1) <= 0.15 for x in e) for *_, e in outside)
    print("outside: " + "; ".join(f"{n} k={k} {q:.3f} (rounds {lohi(e)})"
                                  for n, k, q, e in outside)
          + f" — {inside} of {len(outside)} with a round within ±15 %")
if rounds > 1:
    spread = [max(e) / min(e) - 1 for *_, e in spreads]
    print(f"each run's rounds apart (max/min - 1): median {statistics.median(spread):.3f}, "
          f"largest {max(spread):.3f}")
EOF
