"""A Llama-3-style decoder for bench/gpu/probe.py's training steps (issue 10).

torchtitan's Llama 3 as its Dec 2024 benchmark tables ran it, uncompiled: RMSNorm, rotary
embeddings applied through complex multiplication, grouped-query attention with K/V repeated to
the query heads before SDPA (repeat_kv), SwiGLU MLP, untied output layer, no biases, no dropout,
fp32 cross-entropy on the logits. Falls back to a materialised attention and a composite RMSNorm
on the Debian PyTorch 1.13 used for the probe's --smoke check.
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def rms_norm(x, weight, eps, composite=False):
    """F.rms_norm (one fused kernel in recent PyTorch) or, composite=True or on an old PyTorch,
    torchtitan's RMSNorm of Dec 2024: in fp32 by separate kernels, then back to the input dtype."""
    if hasattr(F, "rms_norm") and not composite:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def rope_table(head_dim, seq, theta, device):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq, device=device).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)  # complex64 (seq, head_dim/2)


def apply_rope(x, table):  # x (b, s, heads, d)
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * table.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


def causal_sdpa(q, k, v, backend=None):  # (b, heads, s, d); backend: an SDPBackend name
    if HAS_SDPA and backend is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


class Block(nn.Module):
    def __init__(self, h, heads, kv_heads, ffn, eps, composite_norm, backend):
        super().__init__()
        self.heads, self.kv, self.d, self.eps = heads, kv_heads, h // heads, eps
        self.composite, self.backend = composite_norm, backend
        self.wq = nn.Linear(h, h, bias=False)
        self.wk = nn.Linear(h, kv_heads * self.d, bias=False)
        self.wv = nn.Linear(h, kv_heads * self.d, bias=False)
        self.wo = nn.Linear(h, h, bias=False)
        self.w1 = nn.Linear(h, ffn, bias=False)
        self.w3 = nn.Linear(h, ffn, bias=False)
        self.w2 = nn.Linear(ffn, h, bias=False)
        self.attn_norm = nn.Parameter(torch.ones(h))
        self.ffn_norm = nn.Parameter(torch.ones(h))

    def forward(self, x, table):
        b, s, h = x.shape
        y = rms_norm(x, self.attn_norm, self.eps, self.composite)
        q = self.wq(y).view(b, s, self.heads, self.d)
        k = self.wk(y).view(b, s, self.kv, self.d)
        v = self.wv(y).view(b, s, self.kv, self.d)
        q, k = apply_rope(q, table), apply_rope(k, table)
        rep = self.heads // self.kv  # torchtitan's repeat_kv: expand, then a contiguous copy
        k = k[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        v = v[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        o = causal_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.backend)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, h))
        y = rms_norm(x, self.ffn_norm, self.eps, self.composite)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Llama(nn.Module):
    def __init__(self, V, h, L, heads, kv_heads, ffn, seq, theta=500000.0, eps=1e-5,
                 composite_norm=False, attention_backend=None):
        super().__init__()
        self.eps, self.composite = eps, composite_norm
        self.tok = nn.Embedding(V, h)
        self.layers = nn.ModuleList(Block(h, heads, kv_heads, ffn, eps, composite_norm,
                                          attention_backend) for _ in range(L))
        self.norm = nn.Parameter(torch.ones(h))
        self.output = nn.Linear(h, V, bias=False)
        self.rope = (h // heads, seq, theta)
        self.table = None  # complex64, kept out of the module's buffers so .to(bf16) leaves it


    def forward(self, idx, targets):
        if self.table is None or self.table.device != idx.device:
            self.table = rope_table(*self.rope, idx.device)
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x, self.table)
        logits = self.output(rms_norm(x, self.norm, self.eps, self.composite))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
