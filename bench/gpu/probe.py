#!/usr/bin/env python3
"""Kernel and step-time probe for the operator time model (issue 10), one GPU.

Run on a machine with a CUDA PyTorch (not part of tally's build or CI):
    python3 bench/gpu/probe.py --out-dir probe-h200          # ~4 minutes on an H200
    python3 bench/gpu/probe.py --device cpu --smoke --out-dir /tmp/p   # checks the script here
Writes
  calibration.json  tally-calibration format, "kernels" section (docs/formats.md): a bf16 GEMM grid
                    (torch.matmul), the training steps' GEMMs timed after the steps
                    (gemm_sustained: the power cap), a streaming-copy bandwidth, SDPA attention;
                    `tally plan --calibration calibration.json` fits the kernel constants to it.
  steps.json        measured training steps (forward, backward, AdamW on fp32 masters, each phase
                    timed) of two GPT-2-style models and a Llama-3-8B-shaped one (8 layers, eager;
                    then compiled per block if --budget-s allows), with their shapes and peak
                    memory, for tests/validation to compare with tally's prediction.
  ops.json          per-operator times (probe_ops.py): eager memory-bound kernels, AdamW, the
                    steps' own GEMMs in forward/dgrad/wgrad layouts, SDPA attention per backend.
Timing: CUDA events, warm-up then the median of repetitions; every GEMM result is checked against
an fp32 reference on a slice (correctness in the same run, as nccl-tests does).
"""
import argparse, json, math, os, statistics, sys, time, warnings
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_probe import GPT  # the same GPT-style decoder as the memory probe
from llama import Llama  # a Llama-3-style decoder (torchtitan's, uncompiled)
import probe_ops


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


def graph_timer(device):
    """Median seconds of one call of fn as the GPU runs it back to back: `calls` calls captured
    into a CUDA graph and replayed, so the host's launch cost (Python, dispatch; ~10-20 µs a
    call) is not timed; the operator model prices kernels queued behind each other. On a CPU
    (--smoke) a plain loop."""
    def loop(fn, reps, calls):
        def many():
            for _ in range(calls):
                fn()
        return timer(device)(many, reps) / calls
    if device.type != "cuda":
        return loop

    def run(fn, reps, calls):
        try:
            return graphed(fn, reps, calls)
        except Exception as e:  # a kernel that cannot be captured: time the loop
            print(f"graph capture failed ({type(e).__name__}): timing a loop", file=sys.stderr)
            torch.cuda.synchronize()
            return loop(fn, reps, calls)

    def graphed(fn, reps, calls):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        g.replay()
        return timer(device)(g.replay, reps) / calls
    return run


def calls_for(seconds):
    """Back-to-back calls so that one timed replay lasts about 2 ms."""
    return max(1, min(50, round(2e-3 / max(seconds, 1e-7))))


def gemm_grid(device, dtype, smoke):
    dims = [64, 256, 1024, 4096] if smoke else [128, 512, 1024, 2048, 4096, 8192, 16384]
    inner = [64, 256, 4096] if smoke else [64, 128, 512, 2048, 8192, 16384]
    time_it, graphed, out, eager = timer(device), graph_timer(device), [], []
    for m in dims:
        for n in dims:
            for k in inner:
                if m * n * k > (2 ** 38 if not smoke else 2 ** 28):
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
                reps = 5 if smoke else 10
                one = time_it(lambda: a @ b, reps)  # one call between two events, host included
                t = graphed(lambda: torch.matmul(a, b, out=c), reps, calls_for(one))
                out.append({"m": m, "n": n, "k": k, "batch": 1, "seconds_median": t})
                eager.append({"m": m, "n": n, "k": k, "seconds_one_call": one})
    return out, eager


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


def phase_clock(device):
    """mark() → a token; seconds(a, b) after a synchronize: CUDA events on a GPU."""
    if device.type == "cuda":
        def mark():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return mark, lambda a, b: a.elapsed_time(b) / 1e3, torch.cuda.synchronize
    return time.perf_counter, lambda a, b: b - a, lambda: None


def step_models(smoke):
    """The probe's training steps: GPT-2-style (memory_probe.GPT: tied head, learned positions,
    LayerNorm, GELU, biases) and Llama-3-8B-shaped (llama.Llama) with 8 of its 32 layers."""
    if smoke:
        return [dict(model="gpt", hidden=256, layers=2, heads=4, seq=256, micro_batch=2,
                     vocab=4096),
                dict(model="llama", hidden=256, layers=2, heads=4, kv_heads=2, ffn=704,
                     seq=256, micro_batch=1, vocab=4096),
                dict(model="llama", hidden=256, layers=2, heads=4, kv_heads=2, ffn=704,
                     seq=256, micro_batch=1, vocab=4096, norm="composite")]
    return [dict(model="gpt", hidden=1024, layers=24, heads=16, seq=2048, micro_batch=8,
                 vocab=50304),
            dict(model="gpt", hidden=2048, layers=16, heads=16, seq=2048, micro_batch=4,
                 vocab=50304),
            dict(model="llama", hidden=4096, layers=8, heads=32, kv_heads=8, ffn=14336,
                 seq=8192, micro_batch=1, vocab=128256),
            # torchtitan's kernels of Dec 2024: composite RMSNorm, FlashAttention-2 (SDPA's
            # flash backend), as its published H100 rows ran uncompiled
            dict(model="llama", hidden=4096, layers=8, heads=32, kv_heads=8, ffn=14336,
                 seq=8192, micro_batch=1, vocab=128256, norm="composite",
                 attention_backend="FLASH_ATTENTION")]


def build(st):
    if st["model"] == "llama":
        return Llama(st["vocab"], st["hidden"], st["layers"], st["heads"], st["kv_heads"],
                     st["ffn"], st["seq"], composite_norm=st.get("norm") == "composite",
                     attention_backend=st.get("attention_backend") if HAS_SDPA else None)
    return GPT(st["vocab"], st["seq"], st["hidden"], st["layers"], st["heads"], flash=HAS_SDPA)


def training_step(st, device, smoke, compiled=False):
    """Forward + backward in bf16, then AdamW on fp32 masters (Megatron's mixed precision, as the
    memory probe holds it): the bf16 gradients cast into the masters' fp32 gradients, the step,
    the masters cast back into the bf16 parameters. Phases timed with CUDA events."""
    torch.manual_seed(0)
    model = build(st).to(device).to(torch.bfloat16)
    if compiled:  # torchtitan compiles each transformer block
        for i, blk in enumerate(model.layers if st["model"] == "llama" else model.blocks):
            (model.layers if st["model"] == "llama" else model.blocks)[i] = torch.compile(blk)
    params = list(model.parameters())
    master = [p.detach().float().clone() for p in params]
    for m in master:
        m.grad = torch.zeros_like(m)
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(master, lr=1e-4, **fused)
    cast = probe_ops.cast
    x, y = (torch.randint(0, st["vocab"], (st["micro_batch"], st["seq"]), device=device)
            for _ in range(2))
    mark, seconds, sync = phase_clock(device)

    def step():
        t0 = mark()
        loss = model(x, y)
        t1 = mark()
        loss.backward()
        t2 = mark()
        cast([m.grad for m in master], [p.grad for p in params])
        opt.step()
        cast(params, master)
        for p in params:
            p.grad = None
        t3 = mark()
        return loss, (t0, t1, t2, t3)
    w0 = time.perf_counter()
    for _ in range(3):
        loss0, _ = step()
    sync()
    warmup = time.perf_counter() - w0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    marks, losses = [], []
    for _ in range(3 if smoke else 10):
        loss, m = step()
        marks.append(m)
        losses.append(loss.detach())
    sync()
    ph = [[seconds(m[i], m[i + 1]) for m in marks] for i in range(3)]
    total = [seconds(m[0], m[3]) for m in marks]
    out = dict(st, precision="bf16 parameters, fp32 master + AdamW",
               attention=("sdpa-causal" + (", " + st["attention_backend"]
                                          if st.get("attention_backend") else "")
                          if HAS_SDPA else "materialised"), dropout=False,
               compiled=compiled, params=sum(p.numel() for p in params),
               seconds_median=statistics.median(total),
               forward_seconds=statistics.median(ph[0]), backward_seconds=statistics.median(ph[1]),
               optimizer_seconds=statistics.median(ph[2]), warmup_seconds=warmup,
               loss_first=float(losses[0]), loss_last=float(losses[-1]))
    if device.type == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["reserved_bytes"] = torch.cuda.memory_reserved()
    if st["model"] == "gpt":
        out["ffn"] = 4 * st["hidden"]
    del model, opt, master, params
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def sustained_samples(layouts):
    """The steps' own GEMMs, timed after the steps (at the power cap), as the calibration's
    kernels.gemm_sustained: tally sets the GPU's sustained_gemm from them (Note [power cap])."""
    return [{"m": g["m"], "n": g["n"], "k": g["k"], "batch": 1,
             "seconds_median": g["seconds_median"]} for g in layouts]


def write(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check the script runs")
    ap.add_argument("--peak-flops", type=float, default=989.4e12,
                    help="the device's dense bf16 peak (H100/H200 SXM: 989.4e12)")
    ap.add_argument("--budget-s", type=float, default=330,
                    help="skip the compiled step when this many seconds have passed")
    o = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # SDPA's "kernel not used" notes
    began = time.perf_counter()
    device = torch.device(o.device)
    dtype = torch.bfloat16
    os.makedirs(o.out_dir, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sm = torch.cuda.get_device_properties(device).multi_processor_count \
        if device.type == "cuda" else os.cpu_count()
    log = lambda msg: print(f"[{time.perf_counter() - began:6.1f} s] {msg}", file=sys.stderr,
                            flush=True)
    kernels = {"device": name, "precision": "bf16", "peak_flops": o.peak_flops, "sm_count": sm,
               "memory_bytes_per_s": copy_bandwidth(device, o.smoke)}
    log(f"{name}: copy {kernels['memory_bytes_per_s'] / 1e12:.3f} TB/s")
    kernels["gemm"], gemm_one_call = gemm_grid(device, dtype, o.smoke)
    log(f"{len(kernels['gemm'])} GEMMs")
    kernels["attention"] = attention_points(device, dtype, o.smoke)
    log("attention")
    cal = {"format": "tally-calibration", "version": 1,
           "source": f"bench/gpu/probe.py on {name}, torch {torch.__version__}",
           "kernels": kernels}
    write(os.path.join(o.out_dir, "calibration.json"), cal)

    steps = {"device": name, "torch": torch.__version__, "steps": []}
    shapes = step_models(o.smoke)
    for st in shapes:
        steps["steps"].append(training_step(st, device, o.smoke))
        write(os.path.join(o.out_dir, "steps.json"), steps)
        log(f"step {st['model']} h {st['hidden']}: {steps['steps'][-1]['seconds_median']:.4f} s")

    ops = {"device": name, "torch": torch.__version__, "errors": [],
           "gemm_grid_one_call": gemm_one_call}
    time_it = timer(device)
    reps = 5 if o.smoke else 20
    for key, fn in (("elementwise", lambda: probe_ops.elementwise(device, o.smoke, time_it, reps)),
                    ("optimizer", lambda: probe_ops.optimizer(device, o.smoke, time_it, reps)),
                    ("gemm_layouts", lambda: probe_ops.gemm_layouts(device, shapes, time_it, reps,
                                                                     graph_timer(device))),
                    ("attention", lambda: probe_ops.attention_backends(device, o.smoke, time_it,
                                                                       reps)),
                    ("megatron_layer", lambda: probe_ops.megatron_layer(device, o.smoke, time_it,
                                                                        reps,
                                                                        graph_timer(device)))):
        try:
            ops[key] = fn()
        except Exception as e:  # keep what the other sections measured
            ops["errors"].append(f"{key}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        write(os.path.join(o.out_dir, "ops.json"), ops)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        log(key)

    if ops.get("gemm_layouts"):
        kernels["gemm_sustained"] = sustained_samples(ops["gemm_layouts"])
        write(os.path.join(o.out_dir, "calibration.json"), cal)

    llama = [st for st in shapes if st["model"] == "llama"]
    if device.type == "cuda" and llama and time.perf_counter() - began < o.budget_s:
        try:
            steps["steps"].append(training_step(llama[0], device, o.smoke, compiled=True))
        except Exception as e:
            steps["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        write(os.path.join(o.out_dir, "steps.json"), steps)
        log("compiled llama step")
    log(f"wrote {o.out_dir}/calibration.json, steps.json, ops.json")


if __name__ == "__main__":
    main()
