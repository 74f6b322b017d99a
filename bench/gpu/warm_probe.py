#!/usr/bin/env python3
"""Cold against working GPU: do GEMMs run slower once the GPU has been busy? (issue 10)

probe.py times its GEMM grid on a GPU that has just woken, and the training steps' own GEMMs after
the steps; the second ran ~10 % slower on one H200. This probe times the steps' GEMMs (forward,
dgrad, wgrad of each linear of probe.py's models) cold, then runs back-to-back 8192³ bf16 GEMMs
for --soak-s seconds (their throughput each second is the sustained figure), then times the same
GEMMs and the whole grid again, while nvidia-smi samples the SM clock, power and temperature.
Before the soak, 8192³ calls in threes 0.3 s apart give the burst figure a short benchmark sees;
with --step, probe.py's eager Llama training step runs last under the same sampler.
    python3 bench/gpu/warm_probe.py --out-dir DIR      # ~1 minute on an H200
Writes DIR/warm.json (with nvidia-smi's samples folded in, fold_samples) and
DIR/calibration_warm.json (probe.py's grid, timed warm); the raw samples stay in DIR/clocks.csv and
DIR/reasons.csv.
"""
import argparse, datetime, json, os, subprocess, sys, time
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe
import probe_ops


def start_samplers(out_dir):
    """nvidia-smi every 200 ms into out_dir/clocks.csv and reasons.csv (the reasons' field name
    differs between drivers: its own file, so a refusal loses only it)."""
    samplers = []
    for fields, name in (("timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                          "clocks.csv"),
                         ("timestamp,clocks_event_reasons.active", "reasons.csv")):
        samplers.append(subprocess.Popen(
            ["nvidia-smi", "--query-gpu=" + fields, "--format=csv", "-lms", "200"],
            stdout=open(os.path.join(out_dir, name), "w"), stderr=subprocess.STDOUT))
    return samplers


def burst_and_soak(fn, flops, time_it, graphed, soak_s, began, smoke, on_soak=lambda: None):
    """fn's time as a short benchmark sees it (the third of three calls, 0.3 s apart, eight
    times) and back to back (graph replays of 20 calls for soak_s seconds)."""
    burst = []
    for _ in range(3 if smoke else 8):
        time.sleep(0 if smoke else 0.3)
        fn()
        fn()
        burst.append({"since_start_s": time.time() - began, **flops,
                      "seconds_median": time_it(fn, 1)})
    on_soak()
    soak, t_end = [], time.time() + (1 if smoke else soak_s)
    while time.time() < t_end:
        soak.append({"since_start_s": time.time() - began, **flops,
                     "seconds_median": graphed(fn, 5, 20 if not smoke else 1)})
    return burst, soak


def write_with_samples(out_dir, name, out, samplers):
    """Stop the samplers, fold their rows into out, write out_dir/name."""
    for p in samplers:
        p.terminate()
        p.wait()
    if samplers:
        fold_samples(out_dir, out)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(out, f, indent=1)


def fold_samples(out_dir, out):
    """nvidia-smi's samples (clocks.csv, reasons.csv) into out["samples"]: [seconds since the
    probe began, SM MHz, memory MHz, board W, °C], and out["reasons"]: each distinct
    clocks_event_reasons.active bit mask with its count (0x4: the software power cap)."""
    began = out["marks"][0]["unix_s"] - out["marks"][0]["since_start_s"]
    def rows(name):
        with open(os.path.join(out_dir, name)) as f:
            return [line.strip().split(", ") for line in f.readlines()[1:]]
    def unix(stamp):  # nvidia-smi prints local time; the machine runs on UTC
        t = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f")
        return t.replace(tzinfo=datetime.timezone.utc).timestamp()
    out["samples"] = [[round(unix(r[0]) - began, 3), int(r[1].split()[0]), int(r[2].split()[0]),
                       float(r[3].split()[0]), int(r[4])]
                      for r in rows("clocks.csv") if len(r) == 5 and r[1].endswith("MHz")]
    reasons = {}
    for r in rows("reasons.csv"):
        if len(r) == 2 and r[1].startswith("0x"):
            reasons[r[1]] = reasons.get(r[1], 0) + 1
    out["reasons"] = reasons


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--soak-s", type=float, default=30)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--step", action="store_true",
                    help="then probe.py's Llama step (eager), sampled the same way")
    o = ap.parse_args()
    device = torch.device(o.device)
    began = time.time()
    samplers = start_samplers(o.out_dir) if device.type == "cuda" else []
    marks = []
    mark = lambda what: marks.append({"what": what, "unix_s": time.time(),
                                      "since_start_s": time.time() - began})
    time_it, graphed = probe.timer(device), probe.graph_timer(device)
    shapes = probe.step_models(o.smoke)
    reps = 5 if o.smoke else 10
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__}
    try:
        time.sleep(0 if o.smoke else 2)  # the sampler's first idle rows
        mark("cold layouts")
        out["cold"] = probe_ops.gemm_layouts(device, shapes, time_it, reps, graphed)
        n = 1024 if o.smoke else 8192
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b, c = torch.randn_like(a), torch.empty_like(a)
        mark("burst")
        out["burst"], out["soak"] = burst_and_soak(
            lambda: torch.matmul(a, b, out=c), {"m": n, "n": n, "k": n}, time_it, graphed,
            o.soak_s, began, o.smoke, on_soak=lambda: mark("soak"))
        mark("warm layouts")
        out["warm"] = probe_ops.gemm_layouts(device, shapes, time_it, reps, graphed)
        mark("warm grid")
        grid, _ = probe.gemm_grid(device, torch.bfloat16, o.smoke)
        mark("warm layouts after the grid")
        out["warm_after_grid"] = probe_ops.gemm_layouts(device, shapes, time_it, reps, graphed)
        if o.step:  # a training step under the same sampler: the clock a step runs at
            time.sleep(0 if o.smoke else 3)
            mark("step")
            out["step"] = probe.training_step(shapes[-1] if o.smoke else shapes[2], device,
                                              o.smoke)
        mark("end")
        out["marks"] = marks
        write_with_samples(o.out_dir, "warm.json", out, samplers)
        cal = {"format": "tally-calibration", "version": 1,
               "source": f"bench/gpu/warm_probe.py on {out['device']}, torch {torch.__version__}, "
                         f"after {o.soak_s:g} s of 8192³ GEMMs",
               "kernels": {"device": out["device"], "precision": "bf16", "peak_flops": 989.4e12,
                           "gemm": grid}}
        with open(os.path.join(o.out_dir, "calibration_warm.json"), "w") as f:
            json.dump(cal, f, indent=1)
    finally:
        for p in samplers:
            p.terminate()
    print(f"wrote {o.out_dir}/warm.json, calibration_warm.json", file=sys.stderr)


if __name__ == "__main__":
    main()
