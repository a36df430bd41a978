#!/usr/bin/env python3
"""Time PyTorch and Opacus on the CPU for dpcluster's "transformer" preset (issue 30).

The model is model.TransformerLM(2048, 64, 128, 2, 4) (model/seq_spec.go),
layer for layer: token and learned position embeddings (nn.Embedding; the
positions' ids are given per example so Opacus sees a batch dimension),
2 pre-layer-norm blocks [x + Linear(D) ∘ causal attention (4 heads, scale
1/√(D/H), no parameters) ∘ Linear(3D) ∘ LayerNorm, x + Linear(D) ∘ ReLU ∘
Linear(4D) ∘ LayerNorm], a final LayerNorm and Linear(vocab) at every
position. An example is 65 token ids: inputs ids[:64], targets ids[1:]; its
loss is the mean of its 64 next-token cross-entropies. The parameter count
is checked against the preset's (931,328).

Steps timed, at B = 64 random sequences (as BenchmarkTransformerStep):

  nonprivate    forward, the batch's mean loss, backward (torch.autograd.grad)
  opacus_ghost  the clipped per-example gradient sum by Opacus's
                GradSampleModuleFastGradientClipping (ghost norms for
                nn.Linear and nn.Embedding, per-example gradients for
                nn.LayerNorm) and its DPTensorFastGradientClipping two-pass
                backward, with per-example losses (mean over positions),
                loss_reduction "sum", no noise, no optimizer step
  opacus_hooks  the same sum by GradSampleModule (per-example gradients) and
                DPOptimizer.clip_and_accumulate, no noise, no step
  func          per-example gradients by torch.func (or functorch on torch
                1.13) vmap(grad), flat norms, clipped sum; skipped where
                neither is importable

Opacus is imported as bench/gpu/torch_step.py does (its import_opacus: the
submodules only). With --device cuda (issue 29's side-by-side on a GPU, run
by bench/gpu/device-check.sh) the model and batch live on the GPU, TF32 is
off (fp32 throughout, as our engine), and each step is timed between two
torch.cuda.synchronize() calls. Usage:

  python3 bench/cpu_transformer.py --opacus /path/to/opacus-checkout [--threads 2] [--steps 5] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))

VOCAB, CONTEXT, WIDTH, BLOCKS, HEADS = 2048, 64, 128, 2, 4
PRESET_PARAMS = 931328  # model.Preset("transformer").NumParams()


class Attention(nn.Module):
    """Causal multi-head attention over [B, T, 3D] (q, k, v), no parameters."""

    def __init__(self, heads):
        super().__init__()
        self.heads = heads

    def forward(self, qkv):
        b, t, d3 = qkv.shape
        d = d3 // 3
        dh = d // self.heads
        q, k, v = qkv.split(d, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, dh).transpose(1, 2) for z in (q, k, v))
        s = q @ k.transpose(2, 3) / math.sqrt(dh)
        mask = torch.ones(t, t, dtype=torch.bool, device=qkv.device).triu(1)
        p = s.masked_fill(mask, float("-inf")).softmax(-1)
        return (p @ v).transpose(1, 2).reshape(b, t, d)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.qkv, self.att, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), Attention(heads), nn.Linear(d, d)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.proj(self.att(self.qkv(self.ln1(x))))
        return x + self.fc2(F.relu(self.fc1(self.ln2(x))))


class TransformerLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(BLOCKS))
        self.lnf, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, ids, pos):
        x = self.tok(ids) + self.pos(pos)
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))


def per_example_loss(logits, tgt):
    b, t, v = logits.shape
    return F.cross_entropy(logits.reshape(b * t, v), tgt.reshape(b * t), reduction="none").view(b, t).mean(1)


def clip_sum(per, clip):
    """Σᵢ cᵢgᵢ, cᵢ = min(1, C/(‖gᵢ‖+1e-6)), flat norm over all parameters."""
    n = torch.sqrt(sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in per))
    c = (clip / (n + 1e-6)).clamp(max=1.0)
    return [torch.einsum("i,i...->...", c, g) for g in per]


def make_steps(op, clip, batch, device="cpu"):
    steps = {}
    base = TransformerLM().to(device)
    params = list(base.parameters())

    def nonprivate(ids, pos, tgt):
        return torch.autograd.grad(per_example_loss(base(ids, pos), tgt).mean(), params)

    steps["nonprivate"] = nonprivate

    fn = None
    try:
        from torch.func import functional_call, grad, vmap
        fn = "torch.func"
    except ImportError:
        try:
            from functorch import grad, vmap
            from torch.nn.utils.stateless import functional_call
            fn = "functorch"
        except ImportError:
            pass
    if fn:
        names = [n for n, _ in base.named_parameters()]

        def ex_loss(p, i, ps, tg):
            out = functional_call(base, dict(zip(names, p)), (i[None], ps[None]))
            return per_example_loss(out, tg[None])[0]

        def func(ids, pos, tgt):
            per = vmap(grad(ex_loss), in_dims=(None, 0, 0, 0))(tuple(p.detach() for p in params), ids, pos, tgt)
            return clip_sum(per, clip)

        steps["func(" + fn + ")"] = func

    if op is not None:
        import copy
        import opacus.utils.fast_gradient_clipping_utils as fgc
        m = copy.deepcopy(base)
        gsm = op.GradSampleModuleFastGradientClipping(m, batch_first=True, loss_reduction="sum",
                                                      max_grad_norm=clip, use_ghost_clipping=True)
        gp = list(m.parameters())
        gopt = op.DPOptimizerFastGradientClipping(torch.optim.SGD(gp, lr=0.0), noise_multiplier=0.0,
                                                  max_grad_norm=clip, expected_batch_size=batch,
                                                  loss_reduction="sum")

        def ghost(ids, pos, tgt):
            gopt.zero_grad(set_to_none=True)
            fgc.DPTensorFastGradientClipping(gsm, gopt, per_example_loss(gsm(ids, pos), tgt), "sum").backward()
            return [p.grad for p in gp]

        steps["opacus_ghost"] = ghost

        m2 = copy.deepcopy(base)
        hsm = op.GradSampleModule(m2, batch_first=True, loss_reduction="sum")
        hp = list(m2.parameters())
        hopt = op.DPOptimizer(torch.optim.SGD(hp, lr=0.0), noise_multiplier=0.0, max_grad_norm=clip,
                              expected_batch_size=batch, loss_reduction="sum")

        def hooks(ids, pos, tgt):
            hopt.zero_grad(set_to_none=True)
            per_example_loss(hsm(ids, pos), tgt).sum().backward()
            hopt.clip_and_accumulate()
            for p in hp:
                p.grad_sample = None
            return [p.summed_grad for p in hp]

        steps["opacus_hooks"] = hooks
    return base, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--opacus", default=os.environ.get("OPACUS_PATH"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (cuda:N) for the GPU side-by-side")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "batch": a.batch, "device": str(dev)}
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        info["gpu"] = torch.cuda.get_device_name(dev)
        info["tf32"] = False

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    op = None
    if a.opacus is not None:
        from torch_step import import_opacus
        try:
            importlib.import_module("torch.func")
        except ImportError:  # torch 1.13: Opacus 1.5 imports grad/vmap from torch.func; functorch has them
            import types
            import functorch
            from torch.nn.utils.stateless import functional_call
            shim = types.ModuleType("torch.func")
            shim.grad, shim.vmap, shim.functional_call = functorch.grad, functorch.vmap, functional_call
            sys.modules["torch.func"] = shim
            info["torch_func_shim"] = "functorch " + functorch.__version__
        if not hasattr(nn, "RMSNorm"):  # torch < 2.4: Opacus 1.5.4 registers a sampler for it; unused here
            nn.RMSNorm = type("RMSNorm", (nn.Module,), {})
            info["rmsnorm_placeholder"] = True
        # torch 1.13 lacks these torch 2.x names, which Opacus 1.5.4 imports
        # for its distributed (DTensor, FSDP2) paths only; placeholders, unused here.
        import types
        try:
            importlib.import_module("torch.distributed.tensor")
        except ImportError:
            dt = types.ModuleType("torch.distributed.tensor")
            dt.DTensor = type("DTensor", (), {})
            sys.modules["torch.distributed.tensor"] = dt
            torch.distributed.tensor = dt
            info.setdefault("placeholders", []).append("torch.distributed.tensor.DTensor")
        try:
            fsdp = importlib.import_module("torch.distributed.fsdp")
        except Exception:  # Debian's torch 1.13 on Python 3.11: a dataclass error in _shard
            fsdp = types.ModuleType("torch.distributed.fsdp")
            sys.modules["torch.distributed.fsdp"] = fsdp
            torch.distributed.fsdp = fsdp
            info.setdefault("placeholders", []).append("torch.distributed.fsdp")
        for nm in ("MixedPrecisionPolicy", "fully_shard", "FSDPModule"):
            if not hasattr(fsdp, nm):
                setattr(fsdp, nm, type(nm, (), {}))
                info.setdefault("placeholders", []).append("torch.distributed.fsdp." + nm)
        oinfo = {}
        try:
            op = import_opacus(a.opacus, oinfo)
        except Exception as e:  # recorded, the torch steps still run
            oinfo["error"] = f"{type(e).__name__}: {e}"
        info["opacus"] = oinfo
    base, steps = make_steps(op, 1.0, a.batch, dev)
    n = sum(p.numel() for p in base.parameters())
    info["params"] = n
    if n != PRESET_PARAMS:
        sys.exit(f"parameter count {n} != the preset's {PRESET_PARAMS}")
    seq = torch.randint(0, VOCAB, (a.batch, CONTEXT + 1))
    ids, tgt = seq[:, :-1].contiguous().to(dev), seq[:, 1:].contiguous().to(dev)
    pos = torch.arange(CONTEXT).expand(a.batch, CONTEXT).contiguous().to(dev)
    ref = None
    res = {}
    for name, f in steps.items():
        if a.only and name not in a.only.split(","):
            continue
        try:
            out = f(ids, pos, tgt)  # warm-up, and the check
            if name != "nonprivate":
                flat = torch.cat([g.reshape(-1) for g in out])
                if ref is None:
                    ref = flat
                else:
                    info.setdefault("rel_err_vs_first_dp", {})[name] = float((flat - ref).norm() / ref.norm())
            ms = []
            for _ in range(a.steps):
                sync()
                t0 = time.perf_counter()
                f(ids, pos, tgt)
                sync()
                ms.append((time.perf_counter() - t0) * 1e3)
            res[name] = {"median_ms": statistics.median(ms), "ms": [round(x, 1) for x in ms],
                         "seq_per_s": a.batch / statistics.median(ms) * 1e3}
        except Exception as e:
            res[name] = {"error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(res[name]), flush=True)
    info["steps"] = res
    print(json.dumps(info, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(info, fh, indent=1)


if __name__ == "__main__":
    main()
