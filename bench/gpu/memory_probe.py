#!/usr/bin/env python3
"""GPU memory probe (seed's report() probes, 验收标准 ①②③⑥) for a GPT-style decoder on CUDA.

Run on a machine with a CUDA PyTorch (not part of tally's build or CI):
    python3 bench/gpu/memory_probe.py > probe.json
Measures torch.cuda.memory_allocated after model init, after optimizer init, after forward and
after backward, plus peaks, for a GPT-2-medium-shaped model in bf16 with an fp32 master copy and
fp32 Adam moments (created eagerly), with materialised or flash (SDPA) attention. No dropout.
tests/core/test_gpu_probe.cpp compares tally's ledgers with the recorded output.
"""
import json, math, subprocess, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, h, a, flash):
        super().__init__()
        self.h, self.a, self.flash = h, a, flash
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        B, T, C = x.shape
        d = C // self.a
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.a, d).transpose(1, 2) for t in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
            y = att @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))

class GPT(nn.Module):
    def __init__(self, V, P, h, L, a, flash):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, h), nn.Embedding(P, h)
        self.blocks = nn.ModuleList(Block(h, a, flash) for _ in range(L))
        self.lnf = nn.LayerNorm(h)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()          # tied LM head, bf16
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

def probe(V, h, L, a, T, b, flash):
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = GPT(V, T, h, L, a, flash).cuda().to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    idx = torch.randint(0, V, (b, T), device="cuda"); tgt = torch.randint(0, V, (b, T), device="cuda")
    inputs = torch.cuda.memory_allocated() - base
    m = {"after_model_init": torch.cuda.memory_allocated() - base}
    master = [p.detach().float().clone() for p in model.parameters()]     # fp32 master, 4N
    mom = [torch.zeros_like(w) for w in master]; var = [torch.zeros_like(w) for w in master]  # 8N
    m["after_optimizer_init"] = torch.cuda.memory_allocated() - base
    torch.cuda.reset_peak_memory_stats(); torch.cuda.synchronize()
    loss = model(idx, tgt); torch.cuda.synchronize()
    m["after_forward"] = torch.cuda.memory_allocated() - base
    m["peak_forward"] = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    loss.backward(); torch.cuda.synchronize()
    m["after_backward"] = torch.cuda.memory_allocated() - base
    m["peak_backward"] = torch.cuda.max_memory_allocated() - base
    m["reserved"] = torch.cuda.memory_reserved()
    out = {"V": V, "h": h, "L": L, "a": a, "T": T, "b": b,
           "attention": "flash" if flash else "materialized", "params": n,
           "inputs_bytes": inputs, "bytes": m}
    del loss, model, master, mom, var, idx, tgt
    return out

def matmul_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192 ** 3 / (time.perf_counter() - t) / 1e12

if __name__ == "__main__":
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    runs = []
    for flash in (False, True):
        for b in (1, 4, 8):
            runs.append(probe(50257, 1024, 24, 16, 1024, b, flash))
            print(json.dumps(runs[-1]), file=sys.stderr)
    print(json.dumps({"device": torch.cuda.get_device_name(), "nvidia_smi": smi,
                      "torch": torch.__version__, "bf16_matmul_tflops": matmul_tflops(),
                      "runs": runs}, indent=1))
