#!/usr/bin/env python3
"""fp8 GEMMs under the power cap, and memory-bound kernels without launch gaps (issue 10).

warm_probe.py found bf16 GEMMs 15 % slower back to back than in bursts on an H200 (its 700 W
cap). This probe asks the same of fp8 (torch._scaled_mm, e4m3 operands, per-tensor scales, bf16
out: the kind of GEMM Hopper's fp8 constants come from), beside bf16 in the same run, and times
a layer's memory-bound kernels as CUDA-graph replays of back-to-back calls (probe_ops.py timed
them one call at a time, so a ~60 µs kernel carried its launch), with nvidia-smi's samples.
    python3 bench/gpu/cap_probe.py --out-dir DIR       # ~1 minute on an H200
Writes DIR/cap.json.
"""
import argparse, os, sys, time
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe
import warm_probe
from llama import rms_norm


def memory_kernels(device, smoke, graphed, time_it):
    """Forward kernels of a Llama-3-8B layer's shapes, T = 8192 tokens, each replayed back to
    back; shapes, dtypes and seconds (the tests count the bytes)."""
    T, h, ffn, V = (512, 256, 704, 4096) if smoke else (8192, 4096, 14336, 128256)
    bf = torch.bfloat16
    r = lambda *s, dtype=bf: torch.randn(*s, device=device, dtype=dtype)
    x, y, w, bias = r(T, h), r(T, h), r(h), r(h)
    u, v, g = r(T, ffn), r(T, ffn), r(T, 4 * h)
    logits = r(T, V)
    big = torch.empty(1 << (24 if smoke else 30), dtype=torch.uint8, device=device)
    big2 = torch.empty_like(big)
    cases = [("copy", [big.numel()], "uint8", lambda: big2.copy_(big)),
             ("add", [T, h], "bf16", lambda: x + y),
             ("gelu_tanh", [T, 4 * h], "bf16", lambda: F.gelu(g, approximate="tanh")),
             ("silu_mul", [T, ffn], "bf16", lambda: F.silu(u) * v),
             ("layer_norm", [T, h], "bf16", lambda: F.layer_norm(x, (h,), w, bias)),
             ("rms_norm", [T, h], "bf16", lambda: rms_norm(x, w, 1e-5)),
             ("rms_norm_composite", [T, h], "bf16", lambda: rms_norm(x, w, 1e-5, True)),
             ("cast_to_fp32", [T, V], "bf16", lambda: logits.float())]
    out = []
    for name, shape, dtype, fn in cases:
        fn()
        one = time_it(fn, 5)
        row = {"op": name, "shape": shape, "dtype": dtype, "seconds_one_call": one}
        try:
            row["seconds"] = graphed(fn, 10, probe.calls_for(one))
        except Exception as e:  # noqa: BLE001 — keep the other kernels
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--soak-s", type=float, default=15)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    o = ap.parse_args()
    device = torch.device(o.device)
    began = time.time()
    samplers = warm_probe.start_samplers(o.out_dir) if device.type == "cuda" else []
    marks = []
    mark = lambda what: marks.append({"what": what, "unix_s": time.time(),
                                      "since_start_s": time.time() - began})
    time_it, graphed = probe.timer(device), probe.graph_timer(device)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "errors": []}
    n = 1024 if o.smoke else 8192
    try:
        time.sleep(0 if o.smoke else 2)
        mark("memory kernels")
        out["memory_kernels"] = memory_kernels(device, o.smoke, graphed, time_it)
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b, c = torch.randn_like(a), torch.empty_like(a)
        time.sleep(0 if o.smoke else 3)
        mark("bf16 burst")
        out["bf16_burst"], out["bf16_soak"] = warm_probe.burst_and_soak(
            lambda: torch.matmul(a, b, out=c), {"m": n, "n": n, "k": n}, time_it, graphed,
            o.soak_s, began, o.smoke, on_soak=lambda: mark("bf16 soak"))
        time.sleep(0 if o.smoke else 5)
        mark("fp8 burst")
        try:
            e4m3 = torch.float8_e4m3fn
            a8 = a.to(e4m3)
            b8 = torch.randn(n, n, device=device, dtype=torch.bfloat16).to(e4m3).t()  # col-major
            one = torch.ones((), device=device)
            fp8 = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,
                                           out_dtype=torch.bfloat16)
            fp8()
            out["fp8_burst"], out["fp8_soak"] = warm_probe.burst_and_soak(
                fp8, {"m": n, "n": n, "k": n}, time_it, graphed, o.soak_s, began, o.smoke,
                on_soak=lambda: mark("fp8 soak"))
        except (AttributeError, RuntimeError, TypeError) as e:
            out["errors"].append(f"fp8: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        mark("end")
        out["marks"] = marks
        warm_probe.write_with_samples(o.out_dir, "cap.json", out, samplers)
    finally:
        for p in samplers:
            p.terminate()
    print(f"wrote {o.out_dir}/cap.json {out['errors']}", file=sys.stderr)


if __name__ == "__main__":
    main()
