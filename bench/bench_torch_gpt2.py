#!/usr/bin/env python3
"""bench_torch_gpt2: the PyTorch side of pipetrain's GPT-2 throughput comparison.

GPT-2 (pipetrain's shapes: vocabulary padded to 50304, tied head, biases, pre-norm blocks,
GELU tanh) trained in fp32 with AdamW on random tokens, one process, --threads threads
(torch.set_num_threads), attention written out (Debian's torch 1.13 has no fused
attention). Prints the median step's tokens/s and model FLOP/s by pipetrain's own count
(6 N per token + 6 L C T, model_flops_per_token), so the two benchmarks' figures compare.
PyTorch multiplies with the kernel it chose for this CPU (its bundled oneDNN/MKL, or the
system BLAS): `torch.__config__.show()` is printed.

Run with Debian's interpreter (python3-torch installs for /usr/bin/python3 only):
  /usr/bin/python3 bench/bench_torch_gpt2.py [--layers 12] [--seq-len 256] [--mb-size 4]
      [--steps 5] [--threads 1]
"""
import argparse
import math
import os
import statistics
import sys
import time

# One thread means one everywhere: the BLAS's and OpenMP's pools too, set before torch loads.
_threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = _threads

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
        self.qkv, self.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
        self.fc, self.fcproj = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        a = torch.softmax(a.masked_fill(mask, float("-inf")), dim=-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt2(torch.nn.Module):
    def __init__(self, layers, c, heads, vocab, seq):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, c), torch.nn.Embedding(seq, c)
        self.blocks = torch.nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(c)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))
        for p in self.parameters():  # GPT-2's initialisation: N(0, 0.02) matrices, zero biases, unit norms
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--mb-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=5, help="timed steps, after two warm-up steps")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c, heads, vocab = 768, 12, 50304
    model = Gpt2(a.layers, c, heads, vocab, a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    n = sum(x.numel() for x in model.parameters())
    flops_per_token = 6.0 * n + 6.0 * a.layers * c * a.seq_len
    print(torch.__config__.show().strip())
    print(f"BLAS threads: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, torch.get_num_threads()={torch.get_num_threads()}")
    print(f"torch {torch.__version__}, {a.threads} thread(s); GPT-2 {a.layers} layers, {n / 1e6:.2f}M parameters; "
          f"{a.mb_size} x {a.seq_len} tokens a step")
    steps = []
    for s in range(a.steps + 2):  # the first two warm up (PyTorch's allocator settles over them)
        idx = torch.randint(0, 50257, (a.mb_size, a.seq_len))
        tgt = torch.randint(0, 50257, (a.mb_size, a.seq_len))
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        print(f"step {s}: loss {loss.item():.4f}, {dt:.3f} s")
        if s > 1:
            steps.append(dt)
    med = statistics.median(steps)
    tps = a.mb_size * a.seq_len / med
    print(f"tokens/s: {tps:.1f} (median step {med:.3f} s); model FLOP/s: {tps * flops_per_token / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
