#!/usr/bin/env python3
"""The external oracle for pipetrain's Llama: the same tiny model written with PyTorch's
own ops (float64, autograd), from the weights and tokens pipetrain wrote.

Usage: llama_torch.py IN.json OUT.json
IN: {"config": {...}, "B", "T", "tokens", "targets", "params": {name: {"shape", "data"}}}
OUT: {"loss": mean token loss, "grads": {name: flat gradient}}
"""
import json
import sys

import torch

torch.set_default_dtype(torch.float64)


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """Meta's convention: channel pairs (2i, 2i+1) of each head rotated by t * theta^(-2i/hs).
    x: (B, T, heads, hs)."""
    B, T, H, hs = x.shape
    i = torch.arange(0, hs, 2, dtype=torch.float64)
    freqs = theta ** (-i / hs)                                   # (hs/2,)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * freqs[None, :]  # (T, hs/2)
    rot = torch.polar(torch.ones_like(angles), angles)           # e^{i angle}
    xc = torch.view_as_complex(x.reshape(B, T, H, hs // 2, 2).contiguous())
    return torch.view_as_real(xc * rot[None, :, None, :]).reshape(B, T, H, hs)


def main():
    src = json.load(open(sys.argv[1]))
    cfg = src["config"]
    B, T = src["B"], src["T"]
    C, NH, NKV, L = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["n_layer"]
    V, eps, theta = cfg["vocab_size"], cfg["norm_eps"], cfg["rope_theta"]
    hs = C // NH
    P = {}
    for name, t in src["params"].items():
        P[name] = torch.tensor(t["data"], dtype=torch.float64).reshape(t["shape"]).requires_grad_(True)
    tokens = torch.tensor(src["tokens"]).reshape(B, T)
    targets = torch.tensor(src["targets"]).reshape(B * T)

    x = torch.nn.functional.embedding(tokens, P["wte"])         # (B, T, C)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = lambda leaf: P[f"h.{l}.{leaf}"]
        n = rms_norm(x, p("attn_norm.w"), eps)
        qkv = n @ p("attn.qkv.w").T
        q, k, v = qkv.split([NH * hs, NKV * hs, NKV * hs], dim=-1)
        q = rope(q.reshape(B, T, NH, hs), theta).transpose(1, 2)    # (B, NH, T, hs)
        k = rope(k.reshape(B, T, NKV, hs), theta).transpose(1, 2)
        v = v.reshape(B, T, NKV, hs).transpose(1, 2)
        k = k.repeat_interleave(NH // NKV, dim=1)                   # each K/V head serves its group
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = (q @ k.transpose(-1, -2)) / hs ** 0.5
        s = s.masked_fill(~causal, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v                           # (B, NH, T, hs)
        a = a.transpose(1, 2).reshape(B, T, NH * hs)
        h = x + a @ p("attn.o.w").T
        n2 = rms_norm(h, p("mlp_norm.w"), eps)
        g, u = n2 @ p("mlp.gate.w").T, n2 @ p("mlp.up.w").T
        x = h + (torch.nn.functional.silu(g) * u) @ p("mlp.down.w").T
    x = rms_norm(x, P["norm.w"], eps)
    head = P["wte"] if cfg["tie_embeddings"] else P["lm_head.w"]
    logits = x.reshape(B * T, C) @ head[:V].T                    # padded rows are not vocabulary
    loss = torch.nn.functional.cross_entropy(logits, targets)
    loss.backward()
    out = {"loss": loss.item(), "grads": {name: t.grad.reshape(-1).tolist() for name, t in P.items()}}
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
