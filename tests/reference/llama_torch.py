#!/usr/bin/env python3
"""The external oracle for pipetrain's Llama: the same tiny model written with PyTorch's
own ops (float64, autograd), from the weights and tokens pipetrain wrote.

Usage: llama_torch.py IN.json OUT.json [--hf DIR]
IN: {"config": {...}, "B", "T", "tokens", "targets", "params": {name: {"shape", "data"}}}
OUT: {"loss": mean token loss, "grads": {name: flat gradient}}
With --hf DIR the weights come instead from a Hugging Face directory (config.json and
model.safetensors, as `pipetrain ckpt export-hf` writes it) and the model runs Hugging
Face's convention (rotate-half RoPE on its row order): OUT has the loss only.
With config n_experts > 0 every block's MLP is a mixture of experts as Hugging Face's
Mixtral writes it (MixtralSparseMoeBlock): softmax over the router's logits, the top k,
their weights renormalised, each expert w2(silu(w1 x) * w3 x); pipetrain's expert e is
rows [e F, (e + 1) F) of moe.gate.w (w1) and moe.up.w (w3), rows [e C, (e + 1) C) of
moe.down.w (w2). Only the tokens' loss: the auxiliary losses' coefficients must be 0.
"""
import json
import struct
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


def rope_hf(x, theta):
    """Hugging Face's convention: channel i of a head pairs with channel i + hs/2
    (LlamaRotaryEmbedding + apply_rotary_pos_emb)."""
    B, T, H, hs = x.shape
    inv = theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)[None, :, None, :]
    x1, x2 = x[..., : hs // 2], x[..., hs // 2 :]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", t["dtype"]
        b, e = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b : 8 + n + e]), dtype=torch.float32).reshape(t["shape"])
    return out


def mixtral_moe(n, p, E, K):
    """Hugging Face's MixtralSparseMoeBlock on n (B, T, C), pipetrain's parameter layout."""
    C = n.shape[-1]
    F = p("moe.gate.w").shape[0] // E
    probs = torch.softmax(n @ p("moe.router.w").T, dim=-1)      # (B, T, E)
    w, chosen = torch.topk(probs, K, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(n)
    for e in range(E):
        w1, w3 = p("moe.gate.w")[e * F:(e + 1) * F], p("moe.up.w")[e * F:(e + 1) * F]
        w2 = p("moe.down.w")[e * C:(e + 1) * C]
        weight = (w * (chosen == e)).sum(-1, keepdim=True)      # 0 where e is not chosen
        out = out + weight * ((torch.nn.functional.silu(n @ w1.T) * (n @ w3.T)) @ w2.T)
    return out


def hf_params(d):
    """A Hugging Face directory's tensors under pipetrain's names (q and k rows kept in HF's order)."""
    cfg = json.load(open(d + "/config.json"))
    W = read_safetensors(d + "/model.safetensors")
    P = {"wte": W["model.embed_tokens.weight"], "norm.w": W["model.norm.weight"]}
    if not cfg["tie_word_embeddings"]:
        P["lm_head.w"] = W["lm_head.weight"]
    for l in range(cfg["num_hidden_layers"]):
        hf = lambda leaf: W[f"model.layers.{l}.{leaf}"]
        P[f"h.{l}.attn_norm.w"] = hf("input_layernorm.weight")
        P[f"h.{l}.attn.qkv.w"] = torch.cat([hf("self_attn.q_proj.weight"), hf("self_attn.k_proj.weight"),
                                           hf("self_attn.v_proj.weight")])
        P[f"h.{l}.attn.o.w"] = hf("self_attn.o_proj.weight")
        P[f"h.{l}.mlp_norm.w"] = hf("post_attention_layernorm.weight")
        if cfg.get("model_type") == "mixtral":
            E = cfg["num_local_experts"]
            ex = lambda w: [hf(f"block_sparse_moe.experts.{e}.{w}.weight") for e in range(E)]
            P[f"h.{l}.moe.router.w"] = hf("block_sparse_moe.gate.weight")
            P[f"h.{l}.moe.gate.w"], P[f"h.{l}.moe.up.w"] = torch.cat(ex("w1")), torch.cat(ex("w3"))
            P[f"h.{l}.moe.down.w"] = torch.cat(ex("w2"))
            continue
        P[f"h.{l}.mlp.gate.w"] = hf("mlp.gate_proj.weight")
        P[f"h.{l}.mlp.up.w"] = hf("mlp.up_proj.weight")
        P[f"h.{l}.mlp.down.w"] = hf("mlp.down_proj.weight")
    return {k: v.to(torch.float64).requires_grad_(True) for k, v in P.items()}


def main():
    src = json.load(open(sys.argv[1]))
    cfg = src["config"]
    B, T = src["B"], src["T"]
    C, NH, NKV, L = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["n_layer"]
    V, eps, theta = cfg["vocab_size"], cfg["norm_eps"], cfg["rope_theta"]
    hs = C // NH
    hf_dir = sys.argv[sys.argv.index("--hf") + 1] if "--hf" in sys.argv else None
    if hf_dir:
        P = hf_params(hf_dir)
        rope_fn = rope_hf
    else:
        P = {}
        for name, t in src["params"].items():
            P[name] = torch.tensor(t["data"], dtype=torch.float64).reshape(t["shape"]).requires_grad_(True)
        rope_fn = rope
    tokens = torch.tensor(src["tokens"]).reshape(B, T)
    targets = torch.tensor(src["targets"]).reshape(B * T)

    x = torch.nn.functional.embedding(tokens, P["wte"])         # (B, T, C)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        p = lambda leaf: P[f"h.{l}.{leaf}"]
        n = rms_norm(x, p("attn_norm.w"), eps)
        qkv = n @ p("attn.qkv.w").T
        q, k, v = qkv.split([NH * hs, NKV * hs, NKV * hs], dim=-1)
        q = rope_fn(q.reshape(B, T, NH, hs), theta).transpose(1, 2)    # (B, NH, T, hs)
        k = rope_fn(k.reshape(B, T, NKV, hs), theta).transpose(1, 2)
        v = v.reshape(B, T, NKV, hs).transpose(1, 2)
        k = k.repeat_interleave(NH // NKV, dim=1)                   # each K/V head serves its group
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = (q @ k.transpose(-1, -2)) / hs ** 0.5
        s = s.masked_fill(~causal, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v                           # (B, NH, T, hs)
        a = a.transpose(1, 2).reshape(B, T, NH * hs)
        h = x + a @ p("attn.o.w").T
        n2 = rms_norm(h, p("mlp_norm.w"), eps)
        if cfg.get("n_experts", 0) > 0:
            x = h + mixtral_moe(n2, p, cfg["n_experts"], cfg["top_k"])
            continue
        g, u = n2 @ p("mlp.gate.w").T, n2 @ p("mlp.up.w").T
        x = h + (torch.nn.functional.silu(g) * u) @ p("mlp.down.w").T
    x = rms_norm(x, P["norm.w"], eps)
    head = P["wte"] if cfg["tie_embeddings"] else P["lm_head.w"]
    logits = x.reshape(B * T, C) @ head[:V].T                    # padded rows (pipetrain's) are not vocabulary
    loss = torch.nn.functional.cross_entropy(logits, targets)
    if hf_dir:
        json.dump({"loss": loss.item()}, open(sys.argv[2], "w"))
        return
    loss.backward()
    out = {"loss": loss.item(), "grads": {name: t.grad.reshape(-1).tolist() for name, t in P.items()}}
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
