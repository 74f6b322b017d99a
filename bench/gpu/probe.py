#!/usr/bin/env python3
"""Kernel and step-time probe for the operator time model (issue 10), one GPU.

Run on a machine with a CUDA PyTorch (not part of tally's build or CI):
    python3 bench/gpu/probe.py --out-dir probe-h200          # ~3 minutes on an H200
    python3 bench/gpu/probe.py --device cpu --smoke --out-dir /tmp/p   # checks the script here
Writes
  calibration.json  tally-calibration format, "kernels" section (docs/formats.md): a bf16 GEMM grid
                    (torch.matmul), a streaming-copy bandwidth, SDPA attention forward/backward;
                    `tally plan --calibration calibration.json` fits the kernel constants to it.
  steps.json        measured training steps of GPT-style models (forward + backward + AdamW) with
                    their shapes, for tests/validation to compare with tally's prediction.
Timing: CUDA events, warm-up then the median of repetitions; every GEMM result is checked against
an fp32 reference on a slice (correctness in the same run, as nccl-tests does).
"""
import argparse, json, math, os, statistics, sys, time
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_probe import GPT  # the same GPT-style decoder as the memory probe


def timer(device):
    if device.type == "cuda":
        def run(fn, reps):
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); fn(); b.record(); torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            return statistics.median(times)
    else:
        def run(fn, reps):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
            return statistics.median(times)
    return run


def gemm_grid(device, dtype, smoke):
    dims = [64, 256, 1024, 4096] if smoke else [128, 512, 1024, 2048, 4096, 8192, 16384]
    inner = [64, 256, 4096] if smoke else [64, 128, 512, 2048, 8192]
    time_it, out = timer(device), []
    for m in dims:
        for n in dims:
            for k in inner:
                if m * n * k > (2 ** 36 if not smoke else 2 ** 28):
                    continue
                a = torch.randn(m, k, device=device, dtype=dtype)
                b = torch.randn(k, n, device=device, dtype=dtype)
                c = a @ b
                ref = a[:8].float() @ b.float()
                err = (c[:8].float() - ref).abs().max().item() / (ref.abs().max().item() + 1e-30)
                if err > 0.05:
                    raise SystemExit(f"gemm {m}x{n}x{k}: relative error {err:.3g}")
                for _ in range(3):
                    a @ b
                reps = 5 if smoke else 20
                out.append({"m": m, "n": n, "k": k, "batch": 1,
                            "seconds_median": time_it(lambda: a @ b, reps)})
    return out


def copy_bandwidth(device, smoke):
    n = (1 << 24) if smoke else (1 << 30)  # bytes
    x = torch.empty(n, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    t = timer(device)(lambda: y.copy_(x), 5 if smoke else 20)
    return 2.0 * n / t  # read + write


HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0


def causal_attention(q, k, v):
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = q.shape[-2]  # torch 1.13 (Debian, --smoke only): materialised reference
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    att = att.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def attention_points(device, dtype, smoke):
    cases = [(1, 4, 256, 64)] if smoke else [(4, 32, 2048, 128), (2, 32, 4096, 128),
                                             (1, 32, 8192, 128), (8, 16, 2048, 64)]
    time_it, out = timer(device), []
    for b, a, s, d in cases:
        q, k, v = (torch.randn(b, a, s, d, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        fwd = lambda: causal_attention(q, k, v)
        o = fwd()
        g = torch.randn_like(o)
        def fwd_bwd():
            out_ = fwd()
            out_.backward(g)
        fwd_bwd()
        t_f = time_it(fwd, 5 if smoke else 20)
        t_fb = time_it(fwd_bwd, 5 if smoke else 20)
        out.append({"batch": b, "heads": a, "seq": s, "head_dim": d, "causal": True,
                    "forward_seconds": t_f, "backward_seconds": max(t_fb - t_f, 1e-9)})
    return out


def training_steps(device, smoke):
    # (h, layers, heads, seq, micro-batch): GPT-2-medium-like and a wider one.
    shapes = [(256, 2, 4, 256, 2)] if smoke else [(1024, 24, 16, 2048, 8), (2048, 16, 16, 2048, 4)]
    out = []
    for h, L, a, s, b in shapes:
        torch.manual_seed(0)
        model = GPT(50304, s, h, L, a, flash=HAS_SDPA).to(device)
        fused = {"fused": True} if device.type == "cuda" and HAS_SDPA else {}  # torch >= 2.0
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
        x = torch.randint(0, 50304, (b, s), device=device)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(x, x)  # the memory probe's GPT returns the fp32 cross-entropy
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for _ in range(3):
            step()
        t = timer(device)(step, 3 if smoke else 10)
        out.append({"hidden": h, "layers": L, "heads": a, "seq": s, "micro_batch": b,
                    "vocab": 50304, "precision": "bf16-autocast", "optimizer": "adamw-fp32",
                    "attention": "sdpa-causal" if HAS_SDPA else "materialised",
                    "dropout": False, "seconds_median": t})
        del model, opt
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check the script runs")
    ap.add_argument("--peak-flops", type=float, default=989.4e12,
                    help="the device's dense bf16 peak (H100/H200 SXM: 989.4e12)")
    o = ap.parse_args()
    device = torch.device(o.device)
    dtype = torch.bfloat16
    os.makedirs(o.out_dir, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sm = torch.cuda.get_device_properties(device).multi_processor_count \
        if device.type == "cuda" else os.cpu_count()
    kernels = {"device": name, "precision": "bf16", "peak_flops": o.peak_flops, "sm_count": sm,
               "memory_bytes_per_s": copy_bandwidth(device, o.smoke),
               "gemm": gemm_grid(device, dtype, o.smoke),
               "attention": attention_points(device, dtype, o.smoke)}
    cal = {"format": "tally-calibration", "version": 1,
           "source": f"bench/gpu/probe.py on {name}, torch {torch.__version__}",
           "kernels": kernels}
    with open(os.path.join(o.out_dir, "calibration.json"), "w") as f:
        json.dump(cal, f, indent=1)
    steps = {"device": name, "torch": torch.__version__, "steps": training_steps(device, o.smoke)}
    with open(os.path.join(o.out_dir, "steps.json"), "w") as f:
        json.dump(steps, f, indent=1)
    print(f"wrote {o.out_dir}/calibration.json ({len(kernels['gemm'])} GEMMs) and steps.json",
          file=sys.stderr)


if __name__ == "__main__":
    main()
