#!/usr/bin/env python3
# tests/bench_torch.py — the model of `make bench` trained in PyTorch 2, next
# to `./lime bench`: the same shapes, a training step of forward, backward,
# gradient clipping at 1.0 and AdamW with the three groups of docs/training.md,
# on random tokens; in eager mode (attention as an explicit softmax) and with
# torch.compile (scaled_dot_product_attention). Prints tokens/s of each and
# the ratio of ./lime's to it.
#
# Optional, outside the project's dependencies: it runs only where a Python
# with torch is installed, and never in `make test` or CI. For example
#   python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch
#   /tmp/torchenv/bin/python tests/bench_torch.py --threads 2 --rounds 5
#   /tmp/torchenv/bin/python tests/bench_torch.py --threads 1 --config d128 --modes eager
# The model follows lime.cu (docs/model.md): RMSNorm, RoPE (half split),
# causal GQA attention, SwiGLU, tied embeddings; lime adds a router per layer
# l >= 1 that mixes the key/value buffers of layers 0..l before RoPE.
import argparse
import json
import math
import os
import subprocess
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("bench_torch: no torch in this Python (" + sys.executable + "); install it, e.g. "
          "python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch")
    sys.exit(0)

CONFIGS = {  # the two configs of `make bench`
    "d32": dict(L=4, d=32, H=4, R=4, F=96, V=21, B=128, T=88),
    "d128": dict(L=4, d=128, H=4, R=4, F=352, V=32, B=32, T=64),
}


def rmsnorm(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g


def rope(x, cos, sin):  # x (B, T, heads, hd); cos, sin (T, hd/2)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class Model(torch.nn.Module):
    def __init__(self, c, arch, sdpa):
        super().__init__()
        self.c, self.arch, self.sdpa = c, arch, sdpa
        d, H, R, Fh, V, L = c["d"], c["H"], c["R"], c["F"], c["V"], c["L"]
        hd = d // H
        self.hd = hd

        def mat(rows, cols):
            return torch.nn.Parameter(torch.randn(rows, cols) * 0.02)

        self.E = mat(V, d)
        self.wq = torch.nn.ParameterList([mat(H * hd, d) for _ in range(L)])
        self.wk = torch.nn.ParameterList([mat(R * hd, d) for _ in range(L)])
        self.wv = torch.nn.ParameterList([mat(R * hd, d) for _ in range(L)])
        self.wo = torch.nn.ParameterList([mat(d, H * hd) for _ in range(L)])
        self.wg = torch.nn.ParameterList([mat(Fh, d) for _ in range(L)])
        self.wu = torch.nn.ParameterList([mat(Fh, d) for _ in range(L)])
        self.wd = torch.nn.ParameterList([mat(d, Fh) for _ in range(L)])
        self.g_attn = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(d)) for _ in range(L)])
        self.g_mlp = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(d)) for _ in range(L)])
        self.g_final = torch.nn.Parameter(torch.ones(d))
        routers = []
        for l in range(1, L if arch == "lime" else 1):
            b = math.sqrt(3 / ((l + 1) * R))
            w = torch.empty(R, (l + 1) * R).uniform_(-b, b)
            w[:, l * R:] = torch.eye(R)
            routers.append(torch.nn.Parameter(w))
        self.routers = torch.nn.ParameterList(routers)
        f = 10000.0 ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
        ang = torch.arange(c["T"], dtype=torch.float64)[:, None] * f[None, :]
        self.register_buffer("cos", torch.cos(ang).float())
        self.register_buffer("sin", torch.sin(ang).float())

    def groups(self, lr=1e-3, router_lr=1e-2, wd=0.1):
        mats = [p for ps in (self.wq, self.wk, self.wv, self.wo, self.wg, self.wu, self.wd) for p in ps]
        rest = [self.E, self.g_final] + list(self.g_attn) + list(self.g_mlp)
        out = [dict(params=mats, lr=lr, weight_decay=wd), dict(params=rest, lr=lr, weight_decay=0.0)]
        if len(self.routers):
            out.append(dict(params=list(self.routers), lr=router_lr, weight_decay=0.0))
        return out

    def forward(self, tokens, targets):
        c, hd = self.c, self.hd
        B, T, H, R = tokens.shape[0], tokens.shape[1], c["H"], c["R"]
        x = self.E[tokens]
        kbuf, vbuf = [], []
        for l in range(c["L"]):
            a = rmsnorm(x, self.g_attn[l])
            q = (a @ self.wq[l].t()).view(B, T, H, hd)
            k = (a @ self.wk[l].t()).view(B, T, R, hd)
            v = (a @ self.wv[l].t()).view(B, T, R, hd)
            if self.arch == "lime":
                kbuf.append(k)
                vbuf.append(v)
                if l >= 1:  # Kr[t, r] = sum_j W[r, j] K_all[t, j], j over layers 0..l and their kv heads
                    w = self.routers[l - 1]
                    k = torch.einsum("rj,btjd->btrd", w, torch.cat(kbuf, dim=2))
                    v = torch.einsum("rj,btjd->btrd", w, torch.cat(vbuf, dim=2))
            q, k = rope(q, self.cos[:T], self.sin[:T]), rope(k, self.cos[:T], self.sin[:T])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
            if H != R:
                k, v = k.repeat_interleave(H // R, dim=1), v.repeat_interleave(H // R, dim=1)
            if self.sdpa:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
                causal = torch.ones(T, T, dtype=torch.bool, device=s.device).tril()
                o = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v
            x = x + o.transpose(1, 2).reshape(B, T, H * hd) @ self.wo[l].t()
            m = rmsnorm(x, self.g_mlp[l])
            x = x + (F.silu(m @ self.wg[l].t()) * (m @ self.wu[l].t())) @ self.wd[l].t()
        logits = rmsnorm(x, self.g_final) @ self.E.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def make_step(c, arch, mode, warmup):
    """One model and its optimiser; returns a function that runs one training step."""
    torch.manual_seed(1)
    model = Model(c, arch, sdpa=(mode == "compile"))
    opt = torch.optim.AdamW(model.groups(), betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.randint(0, c["V"], (c["B"], c["T"]))
    targets = torch.randint(0, c["V"], (c["B"], c["T"]))
    loss_fn = torch.compile(model) if mode == "compile" else model

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(warmup):
        step()
    return step


def tokens_per_s(c, step, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return c["B"] * c["T"] * steps / (time.perf_counter() - t0)


def lime_bench(binary, c, threads, steps):
    cmd = [binary, "bench", "--layers", str(c["L"]), "--dim", str(c["d"]), "--heads", str(c["H"]), "--kv-heads",
           str(c["R"]), "--ffn", str(c["F"]), "--vocab", str(c["V"]), "--batch", str(c["B"]), "--seq-len", str(c["T"]),
           "--steps", str(steps), "--threads", str(threads), "--device", "cpu", "--json"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out["llama"]["tokens_per_s"], out["lime"]["tokens_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per model")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (torch.compile compiles in the first)")
    ap.add_argument("--config", choices=["d32", "d128", "both"], default="both")
    ap.add_argument("--modes", default="eager,compile", help="eager, compile or both (comma-separated)")
    ap.add_argument("--lime", default="./lime", help="the ./lime binary to compare with ('' to skip it)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating rounds (./lime, then each torch model), medians reported")
    a = ap.parse_args()
    for flag in ("threads", "steps", "rounds"):
        if getattr(a, flag) < 1:
            sys.exit(f"bench_torch: --{flag} must be at least 1")
    if a.warmup < 0:
        sys.exit("bench_torch: --warmup must be 0 or more")
    modes = a.modes.split(",")
    if any(m not in ("eager", "compile") for m in modes):
        sys.exit(f"bench_torch: --modes {a.modes!r}: use eager, compile or eager,compile")
    if a.lime and not (os.path.isfile(a.lime) and os.access(a.lime, os.X_OK)):
        sys.exit(f"bench_torch: --lime {a.lime}: not an executable; build it with make, or pass --lime ''")
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} threads, {a.steps} steps after {a.warmup} warm-up, "
          f"medians of {a.rounds} alternating rounds (tokens/s; lime/X: the median of the rounds' ratios)")
    print(f"{'config':6} {'arch':6} {'./lime':>9} " + " ".join(f"{m:>9} {'lime/' + m:>13}" for m in modes))
    median = lambda xs: sorted(xs)[len(xs) // 2]
    for name in (["d32", "d128"] if a.config == "both" else [a.config]):
        c = CONFIGS[name]
        steps = {(arch, m): make_step(c, arch, m, a.warmup) for arch in ["llama", "lime"] for m in modes}
        ours, theirs = [], {k: [] for k in steps}
        for _ in range(a.rounds):  # the machine's speed drifts: each round times both, one after the other
            ours.append(lime_bench(a.lime, c, a.threads, a.steps) if a.lime else (float("nan"), float("nan")))
            for k, step in steps.items():
                theirs[k].append(tokens_per_s(c, step, a.steps))
        for i, arch in enumerate(["llama", "lime"]):
            row = f"{name:6} {arch:6} {median([o[i] for o in ours]):9.0f} "
            for m in modes:
                tps = theirs[(arch, m)]
                ratio = median([o[i] / t for o, t in zip(ours, tps)])
                row += f"{median(tps):9.0f} {ratio:13.2f} "
            print(row, flush=True)


if __name__ == "__main__":
    main()
