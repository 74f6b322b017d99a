"""Per-operator measurements for bench/gpu/probe.py (issue 10): what the operator time model
prices one by one — the memory-bound kernels of a layer as eager PyTorch runs them, the optimizer
step, the training steps' own GEMMs in the three layouts a linear layer runs (forward X·Wᵀ,
input gradient dY·W, weight gradient dYᵀ·X), and SDPA attention per backend (grouped-query
attention included). Shapes, dtypes and seconds only: tests/validation counts the bytes and
FLOPs itself.
"""
import torch
import torch.nn.functional as F

from llama import apply_rope, rope_table, rms_norm


@torch.no_grad()
def cast(dst, src):
    """dst[i].copy_(src[i]) for each tensor, converting dtype: one multi-tensor kernel where
    PyTorch has torch._foreach_copy_ (>= 2.1), else a loop."""
    copy = getattr(torch, "_foreach_copy_", None)
    if copy is not None:
        copy(dst, src)
    else:
        for x, y in zip(dst, src):
            x.copy_(y)


def fwd_bwd(time_it, make_inputs, fn, reps, params=()):
    """Median seconds of fn's forward, and of its backward (fwd+bwd − fwd). The gradients of the
    inputs and params are returned by autograd.grad, not added into .grad, so no accumulation
    kernel is timed."""
    xs = make_inputs()
    wrt = [x for x in xs if x.requires_grad] + list(params)
    y = fn(*xs)
    g = torch.randn_like(y)
    t_f = time_it(lambda: fn(*xs), reps)
    t_fb = time_it(lambda: torch.autograd.grad(fn(*xs), wrt, g), reps)
    return t_f, max(t_fb - t_f, 0.0)


def elementwise(device, smoke, time_it, reps):
    T, h, ffn, V = (512, 256, 704, 4096) if smoke else (8192, 4096, 14336, 128256)
    heads, kv, d = (4, 2, 64) if smoke else (32, 8, 128)
    bf = torch.bfloat16

    def rnd(*shape, dtype=bf, grad=True):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

    out = []

    def add(op, shape, dtype, f, b=None, **extra):
        out.append({"op": op, "shape": list(shape), "dtype": dtype, "forward_seconds": f,
                    **({"backward_seconds": b} if b is not None else {}), **extra})

    a, b2 = rnd(T, h, grad=False), rnd(T, h, grad=False)
    add("add", (T, h), "bf16", time_it(lambda: a + b2, reps))
    w, bias = rnd(h), rnd(h)
    add("layer_norm", (T, h), "bf16",
        *fwd_bwd(time_it, lambda: (rnd(T, h),), lambda x: F.layer_norm(x, (h,), w, bias), reps,
                 (w, bias)))
    add("rms_norm", (T, h), "bf16",
        *fwd_bwd(time_it, lambda: (rnd(T, h),), lambda x: rms_norm(x, w, 1e-5), reps, (w,)),
        impl="F.rms_norm" if hasattr(F, "rms_norm") else "composite")

    def composite(x):  # torchtitan's RMSNorm of Dec 2024: in fp32, then back
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w
    add("rms_norm_composite", (T, h), "bf16",
        *fwd_bwd(time_it, lambda: (rnd(T, h),), composite, reps, (w,)))
    add("gelu_tanh", (T, 4 * h), "bf16",
        *fwd_bwd(time_it, lambda: (rnd(T, 4 * h),), lambda x: F.gelu(x, approximate="tanh"),
                 reps))
    add("swiglu", (T, ffn), "bf16",
        *fwd_bwd(time_it, lambda: (rnd(T, ffn), rnd(T, ffn)), lambda u, v: F.silu(u) * v, reps))
    table = rope_table(d, T, 500000.0, device)
    add("rope", (1, T, heads, d), "bf16",
        *fwd_bwd(time_it, lambda: (rnd(1, T, heads, d),), lambda x: apply_rope(x, table), reps))
    rep = heads // kv
    add("repeat_kv", (1, T, kv, d), "bf16",
        *fwd_bwd(time_it, lambda: (rnd(1, T, kv, d),),
                 lambda x: x[:, :, :, None, :].expand(1, T, kv, rep, d).reshape(1, T, heads, d),
                 reps), heads=heads)
    add("dropout", (T, h), "bf16",
        time_it(lambda: F.dropout(a, 0.1, training=True), reps))
    logits16 = rnd(T, V, grad=False)
    add("cast_to_fp32", (T, V), "bf16", time_it(lambda: logits16.float(), reps))
    tgt = torch.randint(0, V, (T,), device=device)
    add("cross_entropy", (T, V), "fp32",
        *fwd_bwd(time_it, lambda: (rnd(T, V, dtype=torch.float32),),
                 lambda x: F.cross_entropy(x, tgt), reps))
    del logits16
    emb = torch.nn.Embedding(V, h).to(device=device, dtype=bf)
    idx = torch.randint(0, V, (1, T), device=device)
    add("embedding", (T, V, h), "bf16", *fwd_bwd(time_it, lambda: (), lambda: emb(idx), reps,
                                                  (emb.weight,)))
    return out


def optimizer(device, smoke, time_it, reps):
    """AdamW over fp32 masters, and the mixed-precision casts around it, per parameter."""
    n, per = (4, 1 << 16) if smoke else (64, 1 << 22)  # 268,435,456 parameters on a GPU
    master = [torch.randn(per, device=device) for _ in range(n)]
    for m in master:
        m.grad = torch.randn_like(m)
    out = []
    variants = [("foreach", {"foreach": True})]
    if device.type == "cuda":
        variants.append(("fused", {"fused": True}))
    for name, kw in variants:
        try:
            opt = torch.optim.AdamW(master, lr=1e-4, **kw)
        except (TypeError, RuntimeError) as e:
            out.append({"op": "adamw_" + name, "error": str(e)[:200]})
            continue
        opt.step()
        out.append({"op": "adamw_" + name, "params": n * per, "tensors": n,
                    "seconds": time_it(opt.step, reps)})
        del opt
    half = [torch.empty(per, device=device, dtype=torch.bfloat16) for _ in range(n)]
    out.append({"op": "cast_bf16_to_fp32", "params": n * per, "tensors": n,
                "seconds": time_it(lambda: cast([m.grad for m in master], half), reps)})
    out.append({"op": "cast_fp32_to_bf16", "params": n * per, "tensors": n,
                "seconds": time_it(lambda: cast(half, master), reps)})
    return out


def linear_shapes(step):
    """(out, in) of each distinct linear layer of a probe step's model, the LM head included."""
    h, V = step["hidden"], step["vocab"]
    if step["model"] == "llama":
        kvd = step["kv_heads"] * (h // step["heads"])
        return [(h, h), (kvd, h), (step["ffn"], h), (h, step["ffn"]), (V, h)]
    return [(3 * h, h), (h, h), (4 * h, h), (h, 4 * h), (V, h)]


def linear_layouts(device, T, o, i, time_it, reps, graphed):
    """One linear layer's three GEMMs on T tokens, (m, n, k) as core's operator list writes them,
    each timed by CUDA-graph replays (and once by one call, for comparison)."""
    out = []
    x = torch.randn(T, i, device=device, dtype=torch.bfloat16)
    w = torch.randn(o, i, device=device, dtype=torch.bfloat16)
    dy = torch.randn(T, o, device=device, dtype=torch.bfloat16)
    for name, a, b in (("forward", x, w.t()), ("dgrad", dy, w), ("wgrad", dy.t(), x)):
        c = a @ b
        one = time_it(lambda: a @ b, reps)
        t = graphed(lambda: torch.matmul(a, b, out=c), reps,
                    max(1, min(50, round(2e-3 / max(one, 1e-7)))))
        out.append({"tokens": T, "out": o, "in": i, "pass": name, "m": a.shape[0],
                    "n": b.shape[1], "k": a.shape[1], "seconds_median": t,
                    "seconds_one_call": one})
    return out


def gemm_layouts(device, steps, time_it, reps, graphed):
    out, seen = [], set()
    for st in steps:
        T = st["micro_batch"] * st["seq"]
        for o, i in linear_shapes(st):
            if (T, o, i) in seen:
                continue
            seen.add((T, o, i))
            out += linear_layouts(device, T, o, i, time_it, reps, graphed)
    return out


def megatron_layer(device, smoke, time_it, reps, graphed):
    """One tensor-parallel rank's kernels of Korthikanti et al. 2022's 22B layer (Table 4: h 6144,
    64 heads, t = 8, b = 4, s = 2048; materialised attention, GELU MLP, biases, dropout 0.1),
    each timed alone, forward and backward, in bf16: the kernels tally's development set prices
    (tests/validation/test_published_runs.cpp), so a run on an A100 says which of them the A100
    constants miss. The attention core runs as PyTorch's own kernels (Megatron's fused scale-mask-
    softmax is not PyTorch's; the softmax here is torch.softmax on scaled, masked scores)."""
    h, a, t, b, s = (256, 8, 2, 2, 256) if smoke else (6144, 64, 8, 4, 2048)
    T, heads, d = b * s, a // t, h // a
    out = {"model": "korthikanti-22b", "hidden": h, "heads": a, "tp": t, "micro_batch": b,
           "seq": s, "gemm": [], "kernels": []}
    for o, i in ((3 * h // t, h), (h, h // t), (4 * h // t, h), (h, 4 * h // t)):
        out["gemm"] += linear_layouts(device, T, o, i, time_it, reps, graphed)
    bf = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, device=device, dtype=bf, requires_grad=True)

    def add(op, shape, f, bw):
        out["kernels"].append({"op": op, "shape": list(shape), "dtype": "bf16",
                               "forward_seconds": f, "backward_seconds": bw})

    add("scores_bmm", (b * heads, s, d, s),
        *fwd_bwd(time_it, lambda: (rnd(b * heads, s, d), rnd(b * heads, d, s)), torch.bmm, reps))
    mask = torch.ones(s, s, device=device, dtype=torch.bool).triu(1)
    add("scale_mask_softmax", (b * heads, s, s),
        *fwd_bwd(time_it, lambda: (rnd(b * heads, s, s),),
                 lambda x: torch.softmax((x * d ** -0.5).masked_fill(mask, float("-inf")), -1),
                 reps))
    add("softmax", (b * heads, s, s),
        *fwd_bwd(time_it, lambda: (rnd(b * heads, s, s),), lambda x: torch.softmax(x, -1), reps))
    add("attention_dropout", (b * heads, s, s),
        *fwd_bwd(time_it, lambda: (rnd(b * heads, s, s),),
                 lambda x: F.dropout(x, 0.1, training=True), reps))
    add("context_bmm", (b * heads, s, s, d),
        *fwd_bwd(time_it, lambda: (rnd(b * heads, s, s), rnd(b * heads, s, d)), torch.bmm, reps))
    w, bias = rnd(h), rnd(h)
    add("layer_norm", (T, h),
        *fwd_bwd(time_it, lambda: (rnd(T, h),), lambda x: F.layer_norm(x, (h,), w, bias), reps,
                 (w, bias)))
    add("bias_dropout_add", (T, h),
        *fwd_bwd(time_it, lambda: (rnd(T, h), rnd(T, h)),
                 lambda x, r: r + F.dropout(x + bias, 0.1, training=True), reps, (bias,)))
    ub = rnd(4 * h // t)
    add("bias_gelu", (T, 4 * h // t),
        *fwd_bwd(time_it, lambda: (rnd(T, 4 * h // t),),
                 lambda x: F.gelu(x + ub, approximate="tanh"), reps, (ub,)))
    return out


def attention_backends(device, smoke, time_it, reps):
    """Causal SDPA forward and backward per backend; (batch, heads, kv_heads, seq, head_dim)."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return [{"error": "no scaled_dot_product_attention in torch " + torch.__version__}]
    cases = [(1, 4, 4, 256, 64)] if smoke else [
        (4, 32, 32, 2048, 128), (2, 32, 32, 4096, 128), (1, 32, 32, 8192, 128),
        (8, 16, 16, 2048, 64), (1, 32, 8, 8192, 128)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = [("default", None)] + [(n, getattr(SDPBackend, n)) for n in
                                          ("FLASH_ATTENTION", "CUDNN_ATTENTION",
                                           "EFFICIENT_ATTENTION") if hasattr(SDPBackend, n)]
    except ImportError:
        backends, sdpa_kernel = [("default", None)], None
    out = []
    for b, a, kv, s, d in cases:
        gqa = {"enable_gqa": True} if kv != a else {}
        for name, be in backends:
            def fn(q, k, v):
                if be is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
            def inputs():
                return tuple(torch.randn(b, n, s, d, device=device, dtype=torch.bfloat16,
                                         requires_grad=True) for n in (a, kv, kv))
            row = {"batch": b, "heads": a, "kv_heads": kv, "seq": s, "head_dim": d,
                   "causal": True, "backend": name}
            try:
                row["forward_seconds"], row["backward_seconds"] = fwd_bwd(time_it, inputs, fn,
                                                                          reps)
            except (RuntimeError, TypeError) as e:
                row["error"] = str(e).splitlines()[0][:200]
            out.append(row)
    return out
