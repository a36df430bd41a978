#!/usr/bin/env python3
"""Time PyTorch and Opacus on the CPU for bench/step's BERT-shaped encoders.

The model is pretrained/testdata/torchref.py's BertForSequenceClassification
(plain torch.nn, Hugging Face's parameter names and arithmetic, eval mode:
no dropout), in float32, with random weights, in the shape bench/step's
-models names: bert-base (12 layers, hidden 768, 12 heads, intermediate
3072, vocabulary 30522, 512 positions, 2 token types) or bert-small (4
layers, 256 wide, 4 heads, intermediate 1024). An example is --seq-len
token ids drawn past BERT's special tokens, none padding (every token
attended, as bench/step's made-up text fills every token), one label of 2;
its loss is the cross-entropy of the classifier's logits. The parameter
count is checked against the engine's (bench/step's params column).

What trains (--trainable, as bench/step's -trainable): full, or last-block
(the last encoder block, the pooler and the classifier: the engine's
layer.<L-1>.*, pooler.*, classifier.*); the other parameters have
requires_grad False, so no step computes their gradients.

Steps timed, at B = --batch examples:

  nonprivate    forward, the batch's mean loss, backward
                (torch.autograd.grad over the trainable parameters)
  opacus_ghost  the clipped per-example gradient sum by Opacus's ghost
                clipping, the pieces PrivacyEngine.make_private(...,
                grad_sample_mode="ghost") wraps the model, optimizer and loss
                in: GradSampleModuleFastGradientClipping (ghost norms for
                nn.Linear and nn.Embedding, per-example gradients for
                nn.LayerNorm), DPOptimizerFastGradientClipping and the
                two-pass backward of DPTensorFastGradientClipping, with
                per-example losses, loss_reduction "sum", no noise, no
                optimizer step
  func          per-example gradients by torch.func (or functorch on torch
                1.13) vmap(grad) over the trainable parameters, flat norms,
                clipped sum

The steps are interleaved: each of --steps rounds times one of each, in a
rotating order, after one warm-up of each, and the median is reported, so
that the ratios between them are measured under the same load. The
warm-up's clipped sums of opacus_ghost and func are compared (relative
error), a check that both compute the same thing.

Opacus is imported as bench/cpu_transformer.py does (its submodules only,
with placeholders for the torch 2.x names it imports for its distributed
paths on torch 1.13): PrivacyEngine itself is not importable without SciPy
(its accountants), which Debian's PyTorch does not need. Usage:

  python3 bench/cpu_bert.py --model bert-small|bert-base --trainable full|last-block \\
      [--opacus /path/to/opacus-checkout] [--batch 8] [--seq-len 128] [--steps 3] [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pretrained", "testdata"))

import torchref  # noqa: E402

# bench/step's shapes (bench/step/bert.go, bertShapes).
SHAPES = {
    "bert-base": dict(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, positions=512, types=2),
    "bert-small": dict(layers=4, hidden=256, heads=4, intermediate=1024, vocab=30522, positions=512, types=2),
}
CLASSES = 2
SEP = 3  # bench/step's vocab.txt: [PAD] [UNK] [CLS] [SEP] [MASK], then words


def _embeddings_forward(self, input_ids, token_type_ids):
    """torchref.BertEmbeddings.forward with the position ids given per
    example ([B, T], not [1, T]), so that Opacus sees a batch dimension in
    every embedding's input; the same values."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape).contiguous()
    x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
    x = x + self.position_embeddings(positions)
    return self.LayerNorm(x)


torchref.BertEmbeddings.forward = _embeddings_forward


def build(shape):
    s = SHAPES[shape]
    c = torchref.Config("bert", s["vocab"], s["hidden"], s["layers"], s["heads"], s["intermediate"], s["positions"],
                        s["types"], 1e-12, "gelu", 0, SEP, CLASSES)
    c.validate()
    torch.manual_seed(1)
    # Training mode (Opacus's hooks record activations only in it); the
    # modules have no dropout, so it computes what eval mode does.
    m = torchref.build(c).float().train()
    return c, m


def engine_params(s):
    """The engine's parameter count of the shape (bench/step's params)."""
    h, v, ff, L = s["hidden"], s["vocab"], s["intermediate"], s["layers"]
    block = 4 * h * h + 4 * h + 2 * h * ff + ff + h + 4 * h
    return (v + s["positions"] + s["types"]) * h + 2 * h + L * block + h * h + h + h * CLASSES + CLASSES


def trainable_patterns(setting, layers):
    if setting == "full":
        return ["*"]
    if setting == "last-block":
        return [f"bert.encoder.layer.{layers - 1}.*", "bert.pooler.*", "classifier.*"]
    sys.exit(f"--trainable {setting}: full or last-block")


def clip_sum(per, clip):
    """Σᵢ cᵢgᵢ, cᵢ = min(1, C/(‖gᵢ‖+1e-6)), flat norm over the trainable parameters."""
    n = torch.sqrt(sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in per))
    c = (clip / (n + 1e-6)).clamp(max=1.0)
    return [torch.einsum("i,i...->...", c, g) for g in per]


def import_opacus_on_old_torch(path, info):
    """bench/cpu_transformer.py's import, placeholders included."""
    import importlib
    import types

    import torch.nn as nn
    sys.path.insert(0, os.path.join(HERE, "gpu"))
    from torch_step import import_opacus
    try:
        importlib.import_module("torch.func")
    except ImportError:
        import functorch
        from torch.nn.utils.stateless import functional_call
        shim = types.ModuleType("torch.func")
        shim.grad, shim.vmap, shim.functional_call = functorch.grad, functorch.vmap, functional_call
        sys.modules["torch.func"] = shim
        info["torch_func_shim"] = "functorch " + functorch.__version__
    if not hasattr(nn, "RMSNorm"):
        nn.RMSNorm = type("RMSNorm", (nn.Module,), {})
        info["rmsnorm_placeholder"] = True
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
    except Exception:
        fsdp = types.ModuleType("torch.distributed.fsdp")
        sys.modules["torch.distributed.fsdp"] = fsdp
        torch.distributed.fsdp = fsdp
        info.setdefault("placeholders", []).append("torch.distributed.fsdp")
    for nm in ("MixedPrecisionPolicy", "fully_shard", "FSDPModule"):
        if not hasattr(fsdp, nm):
            setattr(fsdp, nm, type(nm, (), {}))
    return import_opacus(path, info)


def make_steps(c, base, op, clip, batch):
    steps = {}
    names = [n for n, p in base.named_parameters() if p.requires_grad]
    params = [p for p in base.parameters() if p.requires_grad]

    def nonprivate(inputs, y):
        return torch.autograd.grad(F.cross_entropy(base(inputs), y), params)

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
        frozen = {n: p.detach() for n, p in base.named_parameters() if not p.requires_grad}

        def ex_loss(p, ids, mask, types, yy):
            d = dict(frozen)
            d.update(zip(names, p))
            inp = {"input_ids": ids[None], "attention_mask": mask[None], "token_type_ids": types[None]}
            return F.cross_entropy(functional_call(base, d, (inp,)), yy[None])

        def func(inputs, y):
            per = vmap(grad(ex_loss), in_dims=(None, 0, 0, 0, 0))(
                tuple(p.detach() for p in params), inputs["input_ids"], inputs["attention_mask"],
                inputs["token_type_ids"], y)
            return clip_sum(per, clip)

        steps["func(" + fn + ")"] = func

    if op is not None:
        import copy
        import opacus.utils.fast_gradient_clipping_utils as fgc
        m = copy.deepcopy(base)
        gsm = op.GradSampleModuleFastGradientClipping(m, batch_first=True, loss_reduction="sum",
                                                      max_grad_norm=clip, use_ghost_clipping=True)
        gp = [p for p in m.parameters() if p.requires_grad]
        gopt = op.DPOptimizerFastGradientClipping(torch.optim.SGD(gp, lr=0.0), noise_multiplier=0.0,
                                                  max_grad_norm=clip, expected_batch_size=batch,
                                                  loss_reduction="sum")

        def ghost(inputs, y):
            gopt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(gsm(inputs), y, reduction="none")
            fgc.DPTensorFastGradientClipping(gsm, gopt, loss, "sum").backward()
            return [p.grad for p in gp]

        steps["opacus_ghost"] = ghost
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-small", choices=sorted(SHAPES))
    ap.add_argument("--trainable", default="full")
    ap.add_argument("--opacus", default=os.environ.get("OPACUS_PATH"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "model": a.model,
            "trainable": a.trainable, "batch": a.batch, "seq_len": a.seq_len}
    op = None
    if a.opacus is not None:
        oinfo = {}
        try:
            op = import_opacus_on_old_torch(a.opacus, oinfo)
        except Exception as e:  # recorded; the torch steps still run
            oinfo["error"] = f"{type(e).__name__}: {e}"
        info["opacus"] = oinfo
    c, base = build(a.model)
    n = sum(p.numel() for p in base.parameters())
    want = engine_params(SHAPES[a.model])
    info["params"] = n
    if n != want:
        sys.exit(f"parameter count {n} != the engine's {want}")
    pats = trainable_patterns(a.trainable, c.layers)
    for name, p in base.named_parameters():
        p.requires_grad_(any(fnmatch.fnmatchcase(name, q) for q in pats))
    info["trainable_params"] = sum(p.numel() for p in base.parameters() if p.requires_grad)
    steps = make_steps(c, base, op, 1.0, a.batch)
    if a.only:
        steps = {k: v for k, v in steps.items() if k in a.only.split(",")}
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, c.vocab, (a.batch, a.seq_len), generator=g)
    inputs = torchref.model_inputs(ids, c)
    y = torch.randint(0, CLASSES, (a.batch,), generator=g)
    ref, res, ms = None, {}, {k: [] for k in steps}
    for name, f in steps.items():  # warm-up, and the check
        try:
            out = f(inputs, y)
            if name != "nonprivate":
                flat = torch.cat([t.reshape(-1) for t in out])
                if ref is None:
                    ref = flat
                else:
                    info.setdefault("rel_err_vs_first_dp", {})[name] = float((flat - ref).norm() / ref.norm())
        except Exception as e:
            res[name] = {"error": f"{type(e).__name__}: {e}"}
            print(name, json.dumps(res[name]), flush=True)
    live = [k for k in steps if k not in res]
    for r in range(a.steps):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for name in order:
            t0 = time.perf_counter()
            steps[name](inputs, y)
            ms[name].append((time.perf_counter() - t0) * 1e3)
    for name in live:
        res[name] = {"median_ms": statistics.median(ms[name]), "ms": [round(x, 1) for x in ms[name]]}
        print(name, json.dumps(res[name]), flush=True)
    if "nonprivate" in live:
        for name in live:
            res[name]["per_nonprivate"] = res[name]["median_ms"] / res["nonprivate"]["median_ms"]
    info["steps"] = res
    print(json.dumps(info, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(info, fh, indent=1)


if __name__ == "__main__":
    main()
