#!/usr/bin/env python3
"""Time PyTorch (and Opacus) on the GPU for the models of dpcluster's GPU benchmark (issue 16).

For each (model, batch size) it times, on one CUDA device:

  nonprivate    forward + softmax cross-entropy (mean over the batch) +
                backward, producing the mean gradient (torch.autograd.grad;
                no optimizer)
  dp            the clipped per-example gradient sum Σᵢ cᵢ∇ℓᵢ with
                cᵢ = min(1, C/(‖∇ℓᵢ‖ + 1e-12)), ℓᵢ example i's cross-entropy
                and the norm taken over ALL parameters (flat clipping):
                per-example gradients by torch.func (vmap(grad(loss)) over
                functional_call), per-example L2 norms, factors, and the
                weighted sum over the batch (einsum), giving the d-vector. No
                noise: a dpcluster node adds none (the coordinator does).
  opacus_ghost  the same sum by Opacus's ghost clipping
                (GradSampleModuleFastGradientClipping + DPLossFastGradientClipping,
                loss_reduction "sum", noise 0): forward, per-example losses,
                the two backward passes of loss.backward(); the clipped sum is
                then in p.grad (no optimizer step). Opacus clips with
                min(1, C/(‖∇ℓᵢ‖ + 1e-6)).
  opacus_hooks  the same sum by Opacus's hooks (GradSampleModule +
                DPOptimizer.clip_and_accumulate, noise 0): forward, backward
                (per-example gradients in p.grad_sample), flat per-example
                norms, factors, weighted sum into p.summed_grad; in the same
                chunks as the dp step (Opacus's BatchMemoryManager way); no
                noise, no optimizer step.

The Opacus steps need the Opacus source (--opacus PATH, or on sys.path); only
its grad-sample, optimizer and clipping modules are imported (not
opacus/__init__.py, which pulls in the accountants and scipy): see
import_opacus() below. Without it they are skipped and the JSON says why.

The models are dpcluster's presets, layer for layer and with the same
parameter names, shapes and order (model/spec.go, model/layer.go): the
d-vector's layout is the node's θ layout. "wide" is MLP([1,28,28],
[4096,4096], 10); "textbag" is TextBag(10000, 64, 64, 4, 128). Inputs are
random normal [B,1,28,28] images (textbag: [B,128] token ids, -1 = padding)
and random labels, already on the device: the times include neither the
upload of the batch nor the download of the result (a dpcluster node does
both every step). Every timed step is synchronized before the next starts,
as a node's step is.

Strict float32 is the default (TF32 off for cuBLAS and cuDNN; a numeric probe
checks it); --tf32 also times with TF32 on. A self-check runs first: the dp
step in float64 against a loop over examples (per-example backward, clip,
sum); the script exits non-zero if it fails. The Opacus steps are checked
against the same loop; a failure there is recorded and printed, not fatal.

Usage (see bench/gpu/README.md):

  python3 bench/gpu/torch_step.py [--tf32] [--json out.json]
  python3 bench/gpu/torch_step.py --opacus gpu-carry --quick --json out.json
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.machinery
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import types
import warnings

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.func import functional_call, grad, vmap
except ImportError:  # the pure-Python helpers below still import
    torch = None

# ---------------------------------------------------------------- models

INPUT = (1, 28, 28)  # per-example input [C, H, W] of the image presets
CLASSES = 10

# Per-model input shape and class count (the Go spec's Input and Classes).
INPUTS = {"mlp": INPUT, "cnn": INPUT, "wide": INPUT, "textbag": (128,)}
NUM_CLASSES = {"mlp": CLASSES, "cnn": CLASSES, "wide": CLASSES, "textbag": 4}

# Layer stacks as in model/spec.go (the JSON field names of LayerSpec). A
# conv2d's stride defaults to 1 and pad to 0; a maxpool's stride to kernel.
SPECS = {
    # MLP([1,28,28], [256,256], 10): the "mlp" preset.
    "mlp": [
        {"type": "flatten"},
        {"type": "linear", "out": 256},
        {"type": "relu"},
        {"type": "linear", "out": 256},
        {"type": "relu"},
        {"type": "linear", "out": 10},
    ],
    # CNN([1,28,28], 10): the "cnn" preset (Papernot et al. 2021).
    "cnn": [
        {"type": "conv2d", "out": 16, "kernel": 8, "stride": 2, "pad": 3},
        {"type": "tanh"},
        {"type": "maxpool", "kernel": 2, "stride": 1},
        {"type": "conv2d", "out": 32, "kernel": 4, "stride": 2},
        {"type": "tanh"},
        {"type": "maxpool", "kernel": 2, "stride": 1},
        {"type": "flatten"},
        {"type": "linear", "out": 32},
        {"type": "tanh"},
        {"type": "linear", "out": 10},
    ],
    # TextBag(10000, 64, 64, 4, 128): the "textbag" preset. Input [128]
    # token ids (-1 = padding); the embedding bag's output is the mean
    # embedding of the non-padding tokens (zero if there are none).
    "textbag": [
        {"type": "embeddingbag", "vocab": 10000, "dim": 64},
        {"type": "linear", "out": 64},
        {"type": "relu"},
        {"type": "linear", "out": 4},
    ],
    # MLP([1,28,28], [4096,4096], 10).
    "wide": [
        {"type": "flatten"},
        {"type": "linear", "out": 4096},
        {"type": "relu"},
        {"type": "linear", "out": 4096},
        {"type": "relu"},
        {"type": "linear", "out": 10},
    ],
}

# model.New(spec).NumParams(), by hand from the specs (and as the Go model
# printed them):
#   mlp:  784·256+256 = 200960; 256·256+256 = 65792; 256·10+10 = 2570
#         → 269322
#   cnn:  [1,28,28] conv 16 k8 s2 p3 → [16,14,14] ((28+6−8)/2+1 = 14):
#         16·1·8·8+16 = 1040; maxpool 2 s1 → [16,13,13];
#         conv 32 k4 s2 → [32,5,5] ((13−4)/2+1 = 5): 32·16·4·4+32 = 8224;
#         maxpool 2 s1 → [32,4,4]; flatten → 512;
#         linear 32: 512·32+32 = 16416; linear 10: 32·10+10 = 330
#         → 1040+8224+16416+330 = 26010
#   wide: 784·4096+4096 = 3215360; 4096·4096+4096 = 16781312;
#         4096·10+10 = 40970 → 20037642
#   textbag: 10000·64 = 640000; 64·64+64 = 4160; 64·4+4 = 260 → 644420
EXPECTED_PARAMS = {"mlp": 269322, "cnn": 26010, "wide": 20037642, "textbag": 644420}

DEFAULT_BATCH = {"mlp": 256, "cnn": 256, "wide": 1024, "textbag": 256}


def plan(layers, input_shape):
    """Infer shapes the way model/layer.go (buildLayer) does.

    Returns (params, shapes): params is the list of (name, shape) in the
    order of the flat parameter vector (layer index, then weight before
    bias), shapes the per-example output shape of every layer.
    """
    shape = tuple(input_shape)
    params, shapes = [], []
    for i, ls in enumerate(layers):
        t = ls["type"]
        if t == "flatten":
            shape = (math.prod(shape),)
        elif t == "linear":
            if len(shape) != 1:
                raise ValueError(f"layer {i}: linear needs a flat input, got {shape}")
            params += [(f"{i}.weight", (ls["out"], shape[0])), (f"{i}.bias", (ls["out"],))]
            shape = (ls["out"],)
        elif t in ("relu", "tanh"):
            pass
        elif t == "conv2d":
            c, h, w = shape
            k, s, p = ls["kernel"], ls.get("stride", 1), ls.get("pad", 0)
            ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            params += [(f"{i}.weight", (ls["out"], c, k, k)), (f"{i}.bias", (ls["out"],))]
            shape = (ls["out"], ho, wo)
        elif t == "maxpool":
            c, h, w = shape
            k = ls["kernel"]
            s = ls.get("stride", k)
            shape = (c, (h - k) // s + 1, (w - k) // s + 1)
        elif t == "embeddingbag":
            if i != 0 or len(shape) != 1:
                raise ValueError(f"layer {i}: embeddingbag must be the first layer, on [L] token ids")
            params += [(f"{i}.weight", (ls["vocab"], ls["dim"]))]
            shape = (ls["dim"],)
        else:
            raise ValueError(f"layer {i}: unsupported layer type {t!r}")
        shapes.append(shape)
    return params, shapes


def count_params(params):
    return sum(math.prod(shape) for _, shape in params)


_Module = nn.Module if torch is not None else object


class EmbedBagNet(_Module):
    """An embedding bag (mean of the non-padding tokens' embeddings) and the
    layers after it, with the spec's layer indices as child names, so that
    the parameters are "0.weight" [vocab, dim], "1.weight", "1.bias", ...,
    in the Go model's order.

    The bag is an nn.Embedding lookup followed by a masked mean, not an
    nn.EmbeddingBag: padding ids (-1) are looked up as id 0 and weighted 0,
    real tokens 1/n (n = the example's real tokens, at least 1, so an
    all-padding example maps to zero), and the weighted embeddings summed
    over the sequence. This adds no parameter row (padding_idx would need
    one), runs under torch.func.vmap, and is what Opacus supports fully:
    nn.Embedding has a grad sampler (hooks) and a ghost-norm sampler, while
    Opacus's nn.EmbeddingBag grad sampler wants the 1-D input + offsets
    form, loops over the batch in Python, ignores per_sample_weights and
    has no ghost-norm sampler. The padding positions' backprops are exactly
    zero, so they add nothing to row 0's per-example gradient."""

    def __init__(self, mods):
        super().__init__()
        for i, m in enumerate(mods):
            self.add_module(str(i), m)
        self.n = len(mods)

    def forward(self, ids):
        mask = ids >= 0
        emb = self._modules["0"](ids.clamp(min=0))  # [B, L, D]
        count = mask.sum(dim=1, keepdim=True).clamp(min=1)  # [B, 1]
        w = mask.to(emb.dtype) / count  # [B, L]: 1/n or 0
        h = (emb * w.unsqueeze(-1)).sum(dim=1)  # [B, D]
        for i in range(1, self.n):
            h = self._modules[str(i)](h)
        return h


def build_model(name):
    """The PyTorch module for a spec: an nn.Sequential whose indices are the
    spec's layer indices, so its parameter names ("1.weight") are the Go
    model's (an EmbedBagNet, same names, for an embedding bag first).
    PyTorch's default initialization, U(±1/√fan_in) for weights and
    biases (fan_in = in, or C·k·k for a convolution), is the Go model's
    uniformInit; nn.Embedding's N(0, 1) is its embedding init."""
    layers = SPECS[name]
    inp = INPUTS[name]
    _, shapes = plan(layers, inp)
    mods = []
    shape = inp
    for i, ls in enumerate(layers):
        t = ls["type"]
        if t == "flatten":
            mods.append(nn.Flatten())  # start_dim=1: C, H, W order, as ours
        elif t == "linear":
            mods.append(nn.Linear(shape[0], ls["out"]))
        elif t == "relu":
            mods.append(nn.ReLU())
        elif t == "tanh":
            mods.append(nn.Tanh())
        elif t == "conv2d":
            mods.append(nn.Conv2d(shape[0], ls["out"], ls["kernel"],
                                  stride=ls.get("stride", 1), padding=ls.get("pad", 0)))
        elif t == "maxpool":
            k = ls["kernel"]
            mods.append(nn.MaxPool2d(k, stride=ls.get("stride", k)))
        elif t == "embeddingbag":
            mods.append(nn.Embedding(ls["vocab"], ls["dim"]))  # see EmbedBagNet
        else:
            raise ValueError(f"layer {i}: unsupported layer type {t!r}")
        shape = shapes[i]
    if shape != (NUM_CLASSES[name],):
        raise ValueError(f"{name}: last layer gives {shape}, want ({NUM_CLASSES[name]},)")
    if layers[0]["type"] == "embeddingbag":
        return EmbedBagNet(mods)
    return nn.Sequential(*mods)


def check_model(name, model):
    """The module's parameters must be the spec's, in name, shape and order,
    and their count the Go model's. Returns the count."""
    want, _ = plan(SPECS[name], INPUTS[name])
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    if got != want:
        raise SystemExit(f"FAIL {name}: parameters {got}, want {want}")
    n = sum(p.numel() for p in model.parameters())
    if n != count_params(want) or n != EXPECTED_PARAMS[name]:
        raise SystemExit(f"FAIL {name}: {n} parameters, want {EXPECTED_PARAMS[name]}")
    return n


# ---------------------------------------------------------------- steps


def make_nonprivate_step(model, functional=False):
    """forward + mean cross-entropy + backward: the tuple of mean gradients,
    by torch.autograd.grad, or with functional by torch.func.grad over
    functional_call (what torch.compile captures whole: autograd.grad breaks
    its graph)."""
    if not functional:
        params = list(model.parameters())

        def step(x, y):
            loss = F.cross_entropy(model(x), y)  # reduction="mean"
            return torch.autograd.grad(loss, params)

        return step

    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach() for n, p in model.named_parameters()}

    def batch_loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x,)), y)  # mean

    batch_grad = grad(batch_loss)

    def fstep(x, y):
        g = batch_grad(params, x, y)
        return tuple(g[n] for n in names)

    return fstep


def make_dp_step(model, clip, chunk):
    """The clipped per-example gradient sum as one d-vector (θ order).

    Per-example gradients come from vmap(grad(ℓ)) over functional_call, in
    chunks of at most `chunk` examples (all B at once needs B·d floats: 82 GB
    for the wide model at B = 1024); each chunk's examples are clipped and
    summed before the next chunk is formed.
    """
    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach() for n, p in model.named_parameters()}

    def example_loss(p, xi, yi):
        logits = functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(logits, yi.unsqueeze(0), reduction="sum")

    per_example_grads = vmap(grad(example_loss), in_dims=(None, 0, 0))

    def step(x, y):
        total = None
        for lo in range(0, x.shape[0], chunk):
            g = per_example_grads(params, x[lo:lo + chunk], y[lo:lo + chunk])
            flat = [g[n].flatten(start_dim=1) for n in names]  # [m, size]
            sq = torch.stack([torch.linalg.vector_norm(t, dim=1) for t in flat]).square().sum(dim=0)
            factor = torch.clamp(clip / (sq.sqrt() + 1e-12), max=1.0)  # [m]
            part = torch.cat([torch.einsum("i,ij->j", factor, t) for t in flat])
            total = part if total is None else total + part
        return total

    return step


def dp_chunk(batch, n_params, total_mem, mem_frac, override):
    """Examples per vmap chunk: all of them if their float32 per-example
    gradients fit in mem_frac of the device memory, else the largest power
    of two that does (override, if set, wins)."""
    if override:
        return max(1, min(override, batch))
    limit = max(1, int(total_mem * mem_frac) // (4 * n_params))
    if limit >= batch:
        return batch
    c = 1
    while c * 2 <= limit:
        c *= 2
    return c


def flatten(out):
    if isinstance(out, (tuple, list)):
        return torch.cat([t.reshape(-1) for t in out])
    return out.reshape(-1)


def rel_err(got, want):
    got, want = got.double(), want.double()
    den = torch.linalg.vector_norm(want).item()
    num = torch.linalg.vector_norm(got - want).item()
    return num / den if den > 0 else num


# ---------------------------------------------------------------- Opacus

STEPS = ("nonprivate", "dp", "opacus_ghost", "opacus_hooks")
OPACUS_STEPS = ("opacus_ghost", "opacus_hooks")

IMPL = {
    "dp": "torch.func vmap(grad)",
    "opacus_ghost": "Opacus GradSampleModuleFastGradientClipping (ghost clipping) "
                    "+ DPLossFastGradientClipping; clipped sum in p.grad",
    "opacus_hooks": "Opacus GradSampleModule (hooks) + DPOptimizer.clip_and_accumulate; "
                    "clipped sum in p.summed_grad",
}

# What the benchmark imports from Opacus. Importing any of them as usual
# would run opacus/__init__.py first, which imports the privacy engine and
# the accountants, and they need scipy (and numpy); none of that is used
# here. import_opacus puts an empty package module in sys.modules["opacus"]
# (its __path__ the real package folder), so only these modules and what
# they import run (torch and the standard library, plus numpy in
# opacus.grad_sample.conv and opacus.utils.tensor_utils for np.prod).
OPACUS_MODULES = (
    "opacus.version",  # __version__
    "opacus.grad_sample",  # GradSampleModule, GradSampleModuleFastGradientClipping, the samplers
    "opacus.optimizers",  # DPOptimizer, DPOptimizerFastGradientClipping
    "opacus.utils.fast_gradient_clipping_utils",  # DPLossFastGradientClipping
)

# torch modules the Opacus modules import, loaded before any stub goes in,
# so that no torch module sees a stub. torch.distributed.fsdp also for
# Opacus's conv grad sampler, which reads torch.distributed.fsdp.FSDPModule
# at run time.
OPACUS_TORCH_PRELOAD = ("torch.func", "torch.optim", "torch.utils.data", "torch.utils.hooks",
                        "torch.nn.utils.rnn", "torch.nn.parallel", "torch.distributed",
                        "torch.distributed.tensor", "torch.distributed.fsdp")


def _stub_numpy():
    # Opacus uses numpy only for np.prod(kernel_size) (conv grad sampler,
    # unfold3d): math.prod gives the same integer.
    m = types.ModuleType("numpy")
    m.prod = lambda a: math.prod(a)
    m.__torch_step_stub__ = True
    return m


def _stub_package(name):
    def make():
        m = types.ModuleType(name)
        m.__path__ = []
        m.__torch_step_stub__ = True
        return m
    return make


def _stub_implicit_replication():
    # Only Opacus's FSDP optimizer uses it (not run here); the old private
    # path torch.distributed._tensor.experimental may be gone from torch.
    m = types.ModuleType("torch.distributed._tensor.experimental")
    try:
        from torch.distributed.tensor.experimental import implicit_replication
    except Exception:
        import contextlib
        implicit_replication = contextlib.nullcontext
    m.implicit_replication = implicit_replication
    m.__torch_step_stub__ = True
    return m


# Modules that may be missing and that the code used here does not need
# (or needs one function of): on ModuleNotFoundError naming one of them, a
# stub goes into sys.modules for the import and is taken out after it.
OPACUS_STUBS = {
    "numpy": _stub_numpy,
    "torch.distributed._tensor": _stub_package("torch.distributed._tensor"),
    "torch.distributed._tensor.experimental": _stub_implicit_replication,
}


def _drop_opacus_modules():
    for k in [k for k in sys.modules if k == "opacus" or k.startswith("opacus.")]:
        del sys.modules[k]


def import_opacus(path, info):
    """Imports the Opacus pieces the benchmark uses, from the package folder
    under path (inserted first in sys.path) or, with no path, wherever
    "opacus" is on sys.path, without running opacus/__init__.py (see
    OPACUS_MODULES). Fills info (where from, version, commit, stubs used)
    and returns a namespace of the classes; raises if Opacus cannot be
    imported."""
    info.update({"path": None, "version": None, "commit": None, "stubs": [],
                 "import": "submodules only: " + ", ".join(OPACUS_MODULES)
                           + " (opacus/__init__.py not run)"})
    if path:
        path = os.path.abspath(path)
        if path not in sys.path:
            sys.path.insert(0, path)
    _drop_opacus_modules()
    spec = importlib.util.find_spec("opacus")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("no opacus package " + (f"under {path}" if path else
                                                  "on sys.path (give --opacus PATH or set OPACUS_PATH)"))
    pkg_dirs = list(spec.submodule_search_locations)
    info["path"] = pkg_dirs[0]
    for m in OPACUS_TORCH_PRELOAD:
        try:
            importlib.import_module(m)
        except Exception:  # Opacus's own import then says what is missing
            pass
    stubs = {}
    try:
        for _ in range(len(OPACUS_STUBS) + 1):
            _drop_opacus_modules()
            root = types.ModuleType("opacus")
            root.__path__ = pkg_dirs
            root.__package__ = "opacus"
            root.__spec__ = importlib.machinery.ModuleSpec("opacus", None, is_package=True)
            root.__spec__.submodule_search_locations = pkg_dirs
            sys.modules["opacus"] = root
            try:
                mods = {n: importlib.import_module(n) for n in OPACUS_MODULES}
                break
            except ModuleNotFoundError as e:
                if e.name not in OPACUS_STUBS or e.name in stubs or e.name in sys.modules:
                    raise
                stubs[e.name] = OPACUS_STUBS[e.name]()
                sys.modules[e.name] = stubs[e.name]
        else:
            raise ImportError("opacus: too many missing modules")
    except BaseException:
        _drop_opacus_modules()
        raise
    finally:
        # The Opacus modules keep their references; nothing else (torch
        # included) may see a stub later.
        for n, m in stubs.items():
            if sys.modules.get(n) is m:
                del sys.modules[n]
        info["stubs"] = sorted(stubs)
    info["version"] = getattr(mods["opacus.version"], "__version__", None)
    for d in (os.path.dirname(pkg_dirs[0]), pkg_dirs[0]):
        try:
            with open(os.path.join(d, "OPACUS_COMMIT")) as f:
                info["commit"] = f.read().strip() or None
            break
        except OSError:
            pass
    gs, opt = mods["opacus.grad_sample"], mods["opacus.optimizers"]
    return types.SimpleNamespace(
        GradSampleModule=gs.GradSampleModule,
        GradSampleModuleFastGradientClipping=gs.GradSampleModuleFastGradientClipping,
        DPOptimizer=opt.DPOptimizer,
        DPOptimizerFastGradientClipping=opt.DPOptimizerFastGradientClipping,
        DPLossFastGradientClipping=mods["opacus.utils.fast_gradient_clipping_utils"].DPLossFastGradientClipping,
    )


def make_opacus_step(op, method, model, clip, batch, chunk):
    """One Opacus step on model (which it wraps with hooks: give it a copy),
    returning the clipped per-example gradient sum Σᵢ cᵢ∇ℓᵢ as a tuple in
    θ order, cᵢ = min(1, C/(‖∇ℓᵢ‖ + 1e-6)) (Opacus's factor), flat clipping,
    loss_reduction "sum", no noise, no parameter update.

    opacus_ghost: GradSampleModuleFastGradientClipping (ghost clipping:
      per-example norms from activations and backprops, without per-example
      gradients, for nn.Linear and nn.Embedding; other layers, the cnn's
      convolutions, through per-example gradients: "fast gradient
      clipping") with DPOptimizerFastGradientClipping and
      DPLossFastGradientClipping: loss.backward() runs backward once with
      the hooks (norms; p.grad gets the unclipped sum), zeroes p.grad and
      runs backward again on Σᵢ cᵢℓᵢ: p.grad is then the clipped sum. The
      optimizer's step (noise, scaling, update) is not run; noise_multiplier
      is 0 anyway.
    opacus_hooks: GradSampleModule (per-example gradients in p.grad_sample
      by the layer hooks) and DPOptimizer.clip_and_accumulate (flat
      per-example norms over all parameters, factors, einsum into
      p.summed_grad), in chunks of at most `chunk` examples, accumulating
      into p.summed_grad across chunks as Opacus's BatchMemoryManager does;
      no add_noise, no step. p.grad also gets the unclipped sum (autograd's
      own backward), as in any Opacus step.
    Each step starts with the optimizer's zero_grad(set_to_none=True), as a
    training loop does."""
    params = [p for p in model.parameters() if p.requires_grad]

    def cleanup():
        """After a failed step (an OOM, say): drop what Opacus left on the
        parameters and modules, so it holds no memory."""
        for p in params:
            p.grad = None
            for a in ("grad_sample", "summed_grad"):
                if hasattr(p, a):
                    setattr(p, a, None)
            for a in ("_norm_sample", "_current_grad_sample"):
                if hasattr(p, a):
                    delattr(p, a)
            p._forward_counter = 0
        for m in model.modules():
            if hasattr(m, "activations"):
                m.activations = []
            if hasattr(m, "max_batch_len"):
                del m.max_batch_len

    if method == "opacus_ghost":
        gsm = op.GradSampleModuleFastGradientClipping(
            model, batch_first=True, loss_reduction="sum", max_grad_norm=clip, use_ghost_clipping=True)
        opt = op.DPOptimizerFastGradientClipping(
            torch.optim.SGD(params, lr=0.0), noise_multiplier=0.0, max_grad_norm=clip,
            expected_batch_size=batch, loss_reduction="sum")
        dp_loss = op.DPLossFastGradientClipping(gsm, opt, nn.CrossEntropyLoss(reduction="sum"),
                                                loss_reduction="sum")

        def ghost_step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = dp_loss(gsm(x), y)  # per-example losses, wrapped
            loss.backward()  # both backward passes
            return tuple(p.grad for p in params)

        ghost_step.cleanup = cleanup
        return ghost_step
    if method == "opacus_hooks":
        gsm = op.GradSampleModule(model, batch_first=True, loss_reduction="sum")
        opt = op.DPOptimizer(torch.optim.SGD(params, lr=0.0), noise_multiplier=0.0, max_grad_norm=clip,
                             expected_batch_size=batch, loss_reduction="sum")

        def hooks_step(x, y):
            opt.zero_grad(set_to_none=True)  # p.grad, p.grad_sample, p.summed_grad
            for lo in range(0, x.shape[0], chunk):
                for p in params:
                    p.grad_sample = None  # the previous chunk's, already accumulated
                loss = F.cross_entropy(gsm(x[lo:lo + chunk]), y[lo:lo + chunk], reduction="sum")
                loss.backward()
                opt.clip_and_accumulate()
            for p in params:
                p.grad_sample = None  # free them now, not at the next step
            return tuple(p.summed_grad for p in params)

        hooks_step.cleanup = cleanup
        return hooks_step
    raise ValueError(f"unknown Opacus method {method!r}")


# ---------------------------------------------------------------- precision

PRECISIONS = ("fp32", "tf32")


def set_precision(mode):
    """Strict float32 (fp32) or TF32 for cuBLAS and cuDNN, through the legacy
    flags only: each legacy setter also sets the new per-backend precision
    (ATen's Context::setAllowTF32CuBLAS and friends), while the new API alone
    leaves the legacy state behind, which mixed-API checks (torch.compile)
    reject."""
    tf32 = mode == "tf32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy API's deprecation notice
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")


def precision_state():
    """The flags as PyTorch reports them (for the log)."""
    state = {}
    reads = {
        "cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "cuda.matmul.fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision,
        "cudnn.conv.fp32_precision": lambda: torch.backends.cudnn.conv.fp32_precision,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, read in reads.items():
            try:
                state[k] = read()
            except Exception as e:  # an attribute this version lacks
                state[k] = f"unreadable: {type(e).__name__}"
    return state


PROBE_FP32_MAX = 5e-5  # float32 lands near 1e-6 here, TF32 near 3e-4


def probe_precision(device):
    """Relative error of a 1024³ matmul and of a convolution against float64:
    shows whether TF32 is in use, whatever the flags say."""
    gen = torch.Generator(device=device).manual_seed(1234)
    a = torch.randn(1024, 1024, device=device, generator=gen)
    b = torch.randn(1024, 1024, device=device, generator=gen)
    x = torch.randn(64, 16, 28, 28, device=device, generator=gen)
    w = torch.randn(32, 16, 4, 4, device=device, generator=gen)
    mm = rel_err(a @ b, a.double() @ b.double())
    cv = rel_err(F.conv2d(x, w, stride=2), F.conv2d(x.double(), w.double(), stride=2))
    torch.cuda.synchronize(device)
    return {"matmul_rel_err": mm, "conv_rel_err": cv}


# ---------------------------------------------------------------- self-check

SELFCHECK_TOL64 = 1e-5  # the brief's bound; float64 lands near 1e-15
SELFCHECK_TOL32 = 1e-4  # the fp32 dp step against the float64 loop


def as_dtype(x, dtype):
    """x in dtype if it is floating point (images); token ids stay integer."""
    return x.to(dtype) if x.is_floating_point() else x


def clipped_sum(per, clip, eps):
    """Σᵢ min(1, C/(‖gᵢ‖ + eps)) gᵢ over the per-example gradients (float64
    loop) and the number of examples clipped."""
    ref = torch.zeros_like(per[0])
    clipped = 0
    for v in per:
        n = torch.linalg.vector_norm(v).item()
        c = min(1.0, clip / (n + eps))
        clipped += c < 1.0
        ref += c * v
    return ref, int(clipped)


def self_check(name, device, seed, opacus=None):
    """The dp step (as timed, and with chunking) against a loop over
    examples: per-example backward, clip, sum, all in float64; the
    nonprivate step against the mean of the per-example gradients; then the
    fp32 dp step against the same float64 reference. With opacus (the
    modules import_opacus returned) also the Opacus steps, in float64 and
    float32, against the loop with Opacus's 1e-6 in the clip factor; their
    result goes under "opacus" and does not decide "ok". Returns a dict of
    errors and passes."""
    B = 8
    torch.manual_seed(seed)
    m64 = build_model(name).to(device=device, dtype=torch.float64)
    check_model(name, m64)
    gen = torch.Generator(device=device).manual_seed(seed)
    x, y = make_inputs(name, B, gen, device, torch.float64)

    params = list(m64.parameters())
    per = []
    for i in range(B):
        loss = F.cross_entropy(m64(x[i:i + 1]), y[i:i + 1], reduction="sum")
        per.append(flatten(torch.autograd.grad(loss, params)))
    norms = sorted(torch.linalg.vector_norm(v).item() for v in per)
    # A clip norm between the 4th and 5th smallest norms: half the examples
    # are clipped, half are not.
    clip = (norms[B // 2 - 1] + norms[B // 2]) / 2
    ref, clipped = clipped_sum(per, clip, 1e-12)
    mean_ref = torch.stack(per).mean(dim=0)

    res = {"model": name, "B": B, "clip": clip, "clipped": clipped, "norms": norms}
    res["dp_f64_rel_err"] = rel_err(make_dp_step(m64, clip, B)(x, y), ref)
    res["dp_f64_chunk3_rel_err"] = rel_err(make_dp_step(m64, clip, 3)(x, y), ref)
    res["nonprivate_f64_rel_err"] = max(
        rel_err(flatten(make_nonprivate_step(m64, functional)(x, y)), mean_ref) for functional in (False, True))
    m32 = copy.deepcopy(m64).float()
    res["dp_f32_rel_err"] = rel_err(make_dp_step(m32, clip, B)(as_dtype(x, torch.float32), y), ref)
    res["ok"] = (0 < clipped < B
                 and res["dp_f64_rel_err"] < SELFCHECK_TOL64
                 and res["dp_f64_chunk3_rel_err"] < SELFCHECK_TOL64
                 and res["nonprivate_f64_rel_err"] < SELFCHECK_TOL64
                 and res["dp_f32_rel_err"] < SELFCHECK_TOL32)
    if opacus is not None:
        res["opacus"] = opacus_self_check(opacus, m64, x, y, clip, per, ref)
    return res


def opacus_self_check(op, m64, x, y, clip, per, ref12):
    """The Opacus steps on copies of m64 against the float64 loop: each
    method in float64 (hooks also in chunks of 3) and float32. The bound
    is against the loop with Opacus's clip factor min(1, C/(‖gᵢ‖ + 1e-6));
    the error against ours (+1e-12) is recorded too (it differs by about
    1e-6/‖gᵢ‖ relative for the clipped examples). One failure does not
    stop the others."""
    B = x.shape[0]
    ref6, clipped6 = clipped_sum(per, clip, 1e-6)
    out = {"clipped_eps1e-6": clipped6, "ok": True}
    cases = [("opacus_ghost", torch.float64, B), ("opacus_hooks", torch.float64, B),
             ("opacus_hooks", torch.float64, 3), ("opacus_ghost", torch.float32, B),
             ("opacus_hooks", torch.float32, B)]
    for method, dtype, chunk in cases:
        key = "%s_%s%s" % (method, "f64" if dtype == torch.float64 else "f32",
                           "" if chunk == B else f"_chunk{chunk}")
        try:
            model = copy.deepcopy(m64).to(dtype)
            step = make_opacus_step(op, method, model, clip, B, chunk)
            got = flatten(step(as_dtype(x, dtype), y)).detach().clone()
            # Twice: the second step must not carry state over from the first.
            got2 = flatten(step(as_dtype(x, dtype), y)).detach().clone()
            err = max(rel_err(got, ref6), rel_err(got2, ref6))
            tol = SELFCHECK_TOL64 if dtype == torch.float64 else SELFCHECK_TOL32
            out[key] = {"rel_err": err, "rel_err_vs_eps1e-12": rel_err(got, ref12),
                        "tol": tol, "ok": err < tol}
        except Exception as e:  # record, go on with the next case
            out[key] = {"error": error_text(e), "ok": False}
        out["ok"] = out["ok"] and out[key]["ok"]
    return out


def error_text(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"


# ---------------------------------------------------------------- timing


def percentile(sorted_vals, q):
    """The q-th percentile by linear interpolation (numpy's default)."""
    n = len(sorted_vals)
    pos = (n - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize(ms):
    s = sorted(ms)
    med = percentile(s, 50)
    return {"n": len(s), "median_ms": med, "p10_ms": percentile(s, 10),
            "p90_ms": percentile(s, 90), "min_ms": s[0], "mean_ms": sum(s) / len(s),
            "steps_per_s": 1000 / med if med > 0 else float("inf")}


def make_inputs(name, batch, gen, device, dtype=None):
    """One random batch (x, y) on the device: normal images in dtype
    (default float32), or for textbag [B, L] token ids uniform in
    [0, vocab) with a random number of trailing -1 (padding) per example,
    at least one real token; labels uniform over the classes."""
    shape = INPUTS[name]
    if SPECS[name][0]["type"] == "embeddingbag":
        L = shape[0]
        ids = torch.randint(0, SPECS[name][0]["vocab"], (batch, L), device=device, generator=gen)
        real = torch.randint(1, L + 1, (batch, 1), device=device, generator=gen)  # real tokens
        pos = torch.arange(L, device=device).unsqueeze(0)
        x = ids.masked_fill(pos >= real, -1)
    else:
        x = torch.randn((batch, *shape), device=device, dtype=dtype or torch.float32, generator=gen)
    y = torch.randint(0, NUM_CLASSES[name], (batch,), device=device, generator=gen)
    return x, y


def make_batches(name, batch, count, gen, device):
    return [make_inputs(name, batch, gen, device) for _ in range(count)]


def run_step(fn, x, y, graphs):
    if graphs and hasattr(torch, "compiler") and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
        torch.compiler.cudagraph_mark_step_begin()
    return fn(x, y)


def cleanup_after_failure(fn):
    try:
        getattr(fn, "cleanup", lambda: None)()
        torch.cuda.empty_cache()
    except Exception:
        pass


def time_step(fn, batches, iters, graphs):
    """iters synchronized steps, rotating over the batches; per step the
    CUDA-event time and the host wall time (launch to result ready), ms."""
    ev, wall = [], []
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    torch.cuda.synchronize()
    for i in range(iters):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        starts[i].record()
        out = run_step(fn, x, y, graphs)
        ends[i].record()
        ends[i].synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        del out
    ev = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return ev, wall


def bench_config(name, batch, prec, args, device, total_mem, opacus=None):
    """Times every step and variant of one (model, B, precision); returns
    result rows. A step that fails to build, warm up or run gets a row
    with "error" and the others go on."""
    torch.manual_seed(args.seed)
    model = build_model(name).to(device)
    n_params = check_model(name, model)
    chunk = dp_chunk(batch, n_params, total_mem, args.dp_mem_frac, args.dp_chunk)
    base = {"model": name, "params": n_params, "B": batch, "precision": prec}

    rows = []
    eager = {}
    for s in args.steps:
        try:
            if s == "nonprivate":
                eager[s] = make_nonprivate_step(model)
            elif s == "dp":
                eager[s] = make_dp_step(model, args.clip, chunk)
            else:  # an Opacus step, on its own copy of the model (its hooks stay there)
                eager[s] = make_opacus_step(opacus, s, copy.deepcopy(model), args.clip, batch, chunk)
        except Exception as e:
            row = dict(base, step=s, variant="eager", impl=IMPL.get(s, ""), error=error_text(e))
            print(f"  {name} B={batch} {prec} {s} eager: {row['error']}", flush=True)
            rows.append(row)
    variants = [("eager", eager)]
    csteps = [s for s in args.compile_steps if s in eager]
    if args.compile != "none" and name in args.compile_models and csteps:
        variants.append((f"compile:{args.compile}",
                         {s: torch.compile(make_nonprivate_step(model, functional=True) if s == "nonprivate"
                                           else eager[s], mode=args.compile)
                          for s in csteps}))

    gen = torch.Generator(device=device).manual_seed(args.seed + batch)
    for vname, fns in variants:
        compiled = vname != "eager"
        graphs = compiled and args.compile == "reduce-overhead"  # CUDA graph trees
        live = {}
        for s, fn in fns.items():
            row = dict(base, step=s, variant=vname)
            if s == "nonprivate":
                row["impl"] = "torch.func.grad" if compiled else "torch.autograd.grad"
            else:
                row["impl"] = IMPL[s]
            if s in ("dp", "opacus_hooks"):
                row["dp_chunk"] = chunk
            try:
                batches = make_batches(name, batch, args.batches, gen, device)
                torch.cuda.reset_peak_memory_stats(device)
                t0 = time.perf_counter()
                for i in range(args.warmup):  # includes compilation, cuDNN autotuning
                    x, y = batches[i % len(batches)]
                    out = run_step(fn, x, y, graphs)
                    del out
                torch.cuda.synchronize(device)
                row["warmup_s"] = time.perf_counter() - t0
                row["peak_mem_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
                if compiled:  # the compiled step must compute what eager does
                    x, y = batches[0]
                    got = flatten(run_step(fn, x, y, graphs)).clone()
                    want = flatten(variants[0][1][s](x, y))
                    row["vs_eager_rel_err"] = rel_err(got, want)
                    del got, want
                live[s] = row
            except Exception as e:  # OOM, compile failure: record and go on
                cleanup_after_failure(fn)
                row["error"] = error_text(e)
                print(f"  {name} B={batch} {prec} {s} {vname}: {row['error']}", flush=True)
                rows.append(row)
        ev = {s: [] for s in live}
        wall = {s: [] for s in live}
        failed = set()
        for r in range(args.repeats):
            # Fresh data each round; alternate which step goes first.
            batches = make_batches(name, batch, args.batches, gen, device)
            order = list(live) if r % 2 == 0 else list(reversed(live))
            for s in order:
                if s in failed:
                    continue
                try:
                    e, w = time_step(fns[s], batches, args.iters, graphs)
                    ev[s] += e
                    wall[s] += w
                except Exception as exc:
                    cleanup_after_failure(fns[s])
                    live[s]["error"] = error_text(exc)
                    print(f"  {name} B={batch} {prec} {s} {vname}: {live[s]['error']}", flush=True)
                    failed.add(s)
            del batches
        for s, row in live.items():
            if s not in failed:
                row.update(summarize(ev[s]))
                row["wall_median_ms"] = percentile(sorted(wall[s]), 50)
                row["examples_per_s"] = batch * row["steps_per_s"]
                row["round_medians_ms"] = [percentile(sorted(ev[s][k * args.iters:(k + 1) * args.iters]), 50)
                                           for k in range(args.repeats)]
            rows.append(row)
    # A private step ÷ nonprivate, per variant, from the medians (the
    # field keeps its name for the Opacus steps); the Opacus steps also ÷
    # the eager torch.func dp step.
    def median_of(step, variant):
        r = next((r for r in rows if r["step"] == step and r["variant"] == variant and "median_ms" in r), None)
        return r["median_ms"] if r else None
    for row in rows:
        if row["step"] != "nonprivate" and "median_ms" in row:
            np_ms = median_of("nonprivate", row["variant"])
            if np_ms:
                row["dp_over_nonprivate"] = row["median_ms"] / np_ms
            dp_ms = median_of("dp", "eager")
            if row["step"] in OPACUS_STEPS and dp_ms:
                row["over_dp_eager"] = row["median_ms"] / dp_ms
    return rows


# ---------------------------------------------------------------- main


def environment(device):
    props = torch.cuda.get_device_properties(device)
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(device),
        "capability": "%d.%d" % torch.cuda.get_device_capability(device),
        "sms": props.multi_processor_count,
        "gpu_mem_gib": props.total_memory / 2**30,
    }
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        env["driver"] = None
    return env, props.total_memory


QUICK = {"warmup": 5, "iters": 20, "repeats": 2, "compile_models": "mlp", "compile_steps": "dp"}
FULL = {"warmup": 20, "iters": 50, "repeats": 3, "compile_models": "", "compile_steps": "nonprivate,dp"}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp,cnn,textbag,wide",
                   help="comma-separated, of %s (default %%(default)s)" % ",".join(SPECS))
    p.add_argument("--batch-sizes", default="",
                   help="comma-separated batch sizes run for every model "
                        "(default: mlp 256, cnn 256, textbag 256, wide 1024)")
    p.add_argument("--steps", default=",".join(STEPS),
                   help="comma-separated, of %s (default all; the Opacus ones are "
                        "skipped, with the reason in the JSON, when Opacus cannot be imported)" % ",".join(STEPS))
    p.add_argument("--opacus", default=os.environ.get("OPACUS_PATH", ""), metavar="PATH",
                   help="folder holding the opacus package (its source; nothing installed), put first "
                        "in sys.path (default: $OPACUS_PATH, else wherever opacus is importable)")
    p.add_argument("--opacus-commit", default="",
                   help="Opacus commit for the JSON (default: the OPACUS_COMMIT file next to the package)")
    p.add_argument("--quick", action="store_true",
                   help="fewer steps (warm-up %(warmup)d, %(repeats)d rounds of %(iters)d) and torch.compile "
                        "only for the %(compile_models)s %(compile_steps)s step, unless given explicitly" % QUICK)
    p.add_argument("--tf32", action="store_true", help="also time with TF32 on (labelled tf32)")
    p.add_argument("--tf32-only", action="store_true", help="time with TF32 on only")
    p.add_argument("--clip", type=float, default=1.0, help="clip norm C (default 1)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed steps first, ≥ 10 unless --quick (default %d; --quick %d)"
                        % (FULL["warmup"], QUICK["warmup"]))
    p.add_argument("--iters", type=int, default=None,
                   help="timed steps per round, ≥ 50 unless --quick (default %d; --quick %d)"
                        % (FULL["iters"], QUICK["iters"]))
    p.add_argument("--repeats", type=int, default=None,
                   help="rounds, each on fresh batches, steps alternating (default %d; --quick %d)"
                        % (FULL["repeats"], QUICK["repeats"]))
    p.add_argument("--batches", type=int, default=4, help="batches on the device to rotate over (default 4)")
    p.add_argument("--dp-chunk", type=int, default=0,
                   help="examples per vmap chunk, and per Opacus hooks chunk "
                        "(default: as many as fit --dp-mem-frac)")
    p.add_argument("--dp-mem-frac", type=float, default=0.25,
                   help="device memory share for a chunk's per-example gradients (default 0.25)")
    p.add_argument("--compile", default="reduce-overhead",
                   choices=["none", "default", "reduce-overhead", "max-autotune"],
                   help="also time the steps under torch.compile with this mode, or none "
                        "(default %(default)s: CUDA graphs, no launch overhead)")
    p.add_argument("--compile-models", default=None,
                   help="comma-separated models to compile (default all selected; --quick: %s)"
                        % QUICK["compile_models"])
    p.add_argument("--compile-steps", default=None,
                   help="comma-separated steps to compile, of nonprivate,dp (default %s; --quick: %s)"
                        % (FULL["compile_steps"], QUICK["compile_steps"]))
    p.add_argument("--no-cudnn-benchmark", action="store_true", help="leave cuDNN autotuning off")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="", help="write every number to this JSON file")
    a = p.parse_args(argv)

    preset = QUICK if a.quick else FULL
    for k in ("warmup", "iters", "repeats", "compile_models", "compile_steps"):
        if getattr(a, k) is None:
            setattr(a, k, preset[k])
    a.models = [m for m in a.models.split(",") if m]
    for m in a.models:
        if m not in SPECS:
            p.error(f"unknown model {m!r} (have {', '.join(SPECS)})")
    try:
        a.batch_sizes = [int(b) for b in a.batch_sizes.split(",") if b]
    except ValueError:
        p.error(f"--batch-sizes: not a list of integers: {a.batch_sizes!r}")
    if any(b < 1 for b in a.batch_sizes):
        p.error("--batch-sizes must be positive")
    a.steps = [s for s in a.steps.split(",") if s]
    if not a.steps or any(s not in STEPS for s in a.steps):
        p.error("--steps: a comma-separated list of " + ", ".join(STEPS))
    a.compile_models = [m for m in a.compile_models.split(",") if m] or list(a.models)
    if any(m not in SPECS for m in a.compile_models):
        p.error(f"--compile-models: of {', '.join(SPECS)}")
    a.compile_steps = [s for s in a.compile_steps.split(",") if s]
    if any(s not in ("nonprivate", "dp") for s in a.compile_steps):
        p.error("--compile-steps: a comma-separated list of nonprivate, dp")
    if not a.quick and a.warmup < 10:
        p.error("--warmup must be ≥ 10 (or give --quick)")
    if not a.quick and a.iters < 50:
        p.error("--iters must be ≥ 50 (or give --quick)")
    if a.warmup < 1 or a.iters < 1 or a.repeats < 1 or a.batches < 1:
        p.error("--warmup, --iters, --repeats and --batches must be ≥ 1")
    if not (a.clip > 0 and math.isfinite(a.clip)):
        p.error("--clip must be positive and finite")
    if a.dp_chunk < 0 or not (0 < a.dp_mem_frac <= 1):
        p.error("--dp-chunk must be ≥ 0 and --dp-mem-frac in (0, 1]")
    a.precisions = ["tf32"] if a.tf32_only else (["fp32", "tf32"] if a.tf32 else ["fp32"])
    return a


def fmt(v, width, prec=3):
    return f"{v:>{width}.{prec}f}" if isinstance(v, float) else f"{v!s:>{width}}"


def main(argv=None):
    t_start = time.perf_counter()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if torch is None:
        raise SystemExit("torch_step: PyTorch is not installed")
    if not torch.cuda.is_available():
        raise SystemExit("torch_step: no CUDA device")
    device = torch.device(args.device)
    # Inductor's advice to turn TF32 on: strict float32 is deliberate here
    # (the probe below checks it).
    warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
    # Opacus's backward hooks on a first layer (its input needs no gradient)
    # fire from the output side, as intended: PyTorch's notice of that.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark

    env, total_mem = environment(device)
    print("torch %s (CUDA %s, cuDNN %s), Python %s" % (env["torch"], env["torch_cuda"], env["cudnn"], env["python"]))
    print("GPU: %s, compute capability %s, %d SMs, %.1f GiB, driver %s"
          % (env["gpu"], env["capability"], env["sms"], env["gpu_mem_gib"], env["driver"]))
    print("Data is already on the device: no host→device upload of x, y and no download "
          "of the result is timed. Each timed step is synchronized.", flush=True)

    # Opacus, if an Opacus step is selected; without it those steps are
    # skipped and the JSON says why.
    opacus, opacus_info = None, {}
    if any(s in OPACUS_STEPS for s in args.steps):
        try:
            opacus = import_opacus(args.opacus, opacus_info)
            if args.opacus_commit:
                opacus_info["commit"] = args.opacus_commit
            print("Opacus %s (commit %s) from %s; stubs: %s"
                  % (opacus_info["version"], opacus_info["commit"], opacus_info["path"],
                     ", ".join(opacus_info["stubs"]) or "none"), flush=True)
        except Exception as e:
            opacus_info["error"] = error_text(e)
            opacus_info["skipped_steps"] = [s for s in args.steps if s in OPACUS_STEPS]
            args.steps = [s for s in args.steps if s not in OPACUS_STEPS]
            print("\n*** OPACUS NOT AVAILABLE, its steps are skipped: %s ***\n" % opacus_info["error"], flush=True)
    else:
        opacus_info["skipped_steps"] = "not selected (--steps)"

    report = {"env": env, "args": {k: v for k, v in vars(args).items()},
              "opacus_version": opacus_info.get("version"), "opacus_commit": opacus_info.get("commit"),
              "opacus": opacus_info,
              "notes": ["inputs on the device already (no upload/download timed)",
                        "each step synchronized; event time is the primary figure",
                        "dp: torch.func vmap(grad) per-example gradients, flat L2 clipping "
                        "min(1, C/(norm+1e-12)), einsum sum; no noise",
                        "opacus_ghost: Opacus ghost clipping (GradSampleModuleFastGradientClipping, "
                        "DPLossFastGradientClipping: two backward passes), loss_reduction sum, clip factor "
                        "min(1, C/(norm+1e-6)); clipped sum in p.grad; no noise, no optimizer step",
                        "opacus_hooks: Opacus GradSampleModule hooks + DPOptimizer.clip_and_accumulate "
                        "(flat clipping, +1e-6), in dp_chunk chunks; clipped sum in p.summed_grad; "
                        "no noise, no optimizer step",
                        "textbag: nn.Embedding + masked mean (padding id -1 weighted 0), "
                        "not nn.EmbeddingBag"],
              "selfcheck": [], "precision": {}, "results": []}

    # Self-check, strict float32 (it also checks the fp32 dp step). A model
    # that fails it is not timed, and the run exits non-zero at the end.
    set_precision("fp32")
    bad_models = []
    opacus_bad = []
    for name in ["mlp"] + [m for m in args.models if m != "mlp"]:
        try:
            res = self_check(name, device, args.seed, opacus if any(s in OPACUS_STEPS for s in args.steps) else None)
        except (Exception, SystemExit) as e:
            res = {"model": name, "error": error_text(e), "ok": False}
        report["selfcheck"].append(res)
        if "error" in res:
            print(f"self-check {name}: ERROR {res['error']}: FAIL", flush=True)
        else:
            print("self-check %-7s B=8 C=%.4g (%d of 8 clipped): dp f64 %.2e, dp f64 chunk 3 %.2e, "
                  "nonprivate f64 %.2e, dp f32 %.2e: %s"
                  % (name, res["clip"], res["clipped"], res["dp_f64_rel_err"], res["dp_f64_chunk3_rel_err"],
                     res["nonprivate_f64_rel_err"], res["dp_f32_rel_err"], "ok" if res["ok"] else "FAIL"),
                  flush=True)
        if not res["ok"]:
            bad_models.append(name)
        op = res.get("opacus")
        if op is not None:
            parts = []
            for k, v in op.items():
                if isinstance(v, dict):
                    parts.append("%s %s" % (k, ("%.2e" % v["rel_err"]) if "rel_err" in v else "ERROR " + v["error"]))
            print("  opacus vs loop (+1e-6): %s: %s" % (", ".join(parts), "ok" if op["ok"] else "FAIL"), flush=True)
            if not op["ok"]:
                opacus_bad.append(name)
                print(f"\n*** OPACUS SELF-CHECK FAILED for {name} (bounds {SELFCHECK_TOL64:g} in float64, "
                      f"{SELFCHECK_TOL32:g} in float32); its timings are still taken ***\n", flush=True)
    report["selfcheck_failed_models"] = bad_models
    report["opacus_selfcheck_failed_models"] = opacus_bad
    if bad_models:
        print("\n*** SELF-CHECK FAILED for %s (bounds: %g in float64, %g for the fp32 dp step): "
              "not timed; the run exits non-zero ***\n" % (", ".join(bad_models), SELFCHECK_TOL64, SELFCHECK_TOL32),
              flush=True)
        if args.json:
            write_json(args.json, report)
    timed_models = [m for m in args.models if m not in bad_models]

    failed = False
    opacus_failed = []
    for prec in args.precisions:
        set_precision(prec)
        probe = probe_precision(device)
        report["precision"][prec] = {"flags": precision_state(), "probe": probe}
        print(f"\n[{prec}] flags {report['precision'][prec]['flags']}")
        print(f"[{prec}] probe vs float64: matmul {probe['matmul_rel_err']:.2e}, conv {probe['conv_rel_err']:.2e}",
              flush=True)
        strict = max(probe.values()) < PROBE_FP32_MAX
        if prec == "fp32" and not strict:
            raise SystemExit(f"torch_step: fp32 mode is not strict float32 (probe error above {PROBE_FP32_MAX:g})")
        if prec == "tf32" and strict:
            print("[tf32] note: the probe shows float32-level error: TF32 does not seem to be in use")
        for name in timed_models:
            for batch in (args.batch_sizes or [DEFAULT_BATCH[name]]):
                print(f"[{prec}] {name} B={batch} ...", flush=True)
                try:
                    rows = bench_config(name, batch, prec, args, device, total_mem, opacus)
                except Exception as e:  # the model itself: record, go on with the next
                    rows = [{"model": name, "B": batch, "precision": prec, "step": "all",
                             "variant": "eager", "error": error_text(e)}]
                    print(f"  {name} B={batch} {prec}: ERROR {rows[0]['error']}", flush=True)
                if args.compile != "none":
                    # Drop compiled code and CUDA graph pools: the next
                    # configuration compiles afresh (no recompile limit hit,
                    # no memory carried over into its peak).
                    torch.compiler.reset()
                torch.cuda.empty_cache()
                for r in rows:
                    if "error" in r:
                        if r["step"] in OPACUS_STEPS:
                            opacus_failed.append(f"{name} B={batch} {prec} {r['step']}: {r['error']}")
                        else:
                            failed = failed or r["variant"] == "eager"
                    else:
                        print("  %-12s %-8s median %.3f ms (p10 %.3f, p90 %.3f), %.1f steps/s, wall %.3f ms%s%s"
                              % (r["step"], r["variant"], r["median_ms"], r["p10_ms"], r["p90_ms"],
                                 r["steps_per_s"], r["wall_median_ms"],
                                 f", /nonprivate {r['dp_over_nonprivate']:.2f}" if "dp_over_nonprivate" in r else "",
                                 f", /dp {r['over_dp_eager']:.2f}" if "over_dp_eager" in r else ""),
                              flush=True)
                report["results"] += rows
                if args.json:  # as we go: a run cut short still leaves its numbers
                    write_json(args.json, report)
    report["opacus_failed"] = opacus_failed
    report["wall_s"] = time.perf_counter() - t_start
    if args.json:
        write_json(args.json, report)

    print("\nPyTorch %s on %s; data on device; per-step medians of %d×%d synchronized steps"
          % (env["torch"], env["gpu"], args.repeats, args.iters))
    head = ("model", "B", "prec", "step", "variant", "chunk", "median_ms", "p10_ms", "p90_ms", "steps/s", "ex/s",
            "/np", "/dp")
    widths = (7, 5, 5, 12, 23, 5, 10, 9, 9, 9, 10, 6, 6)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
    for r in report["results"]:
        if "error" in r:
            print(" ".join(fmt(v, w) for v, w in zip((r["model"], r["B"], r["precision"], r["step"], r["variant"]),
                                                       widths)) + "  ERROR " + r["error"])
            continue
        vals = (r["model"], r["B"], r["precision"], r["step"], r["variant"], r.get("dp_chunk", "-"),
                r["median_ms"], r["p10_ms"], r["p90_ms"], r["steps_per_s"], r["examples_per_s"],
                r.get("dp_over_nonprivate", "-"), r.get("over_dp_eager", "-"))
        cells = []
        for v, w, k in zip(vals, widths, head):
            if k in ("steps/s", "ex/s"):
                cells.append(f"{v:>{w}.0f}")
            elif k in ("/np", "/dp") and isinstance(v, float):
                cells.append(f"{v:>{w}.2f}")
            else:
                cells.append(fmt(v, w))
        print(" ".join(cells))
    print("/np: the step's median over the non-private step's (same variant); "
          "/dp: an Opacus step's over the eager torch.func dp step's")
    print("total %.0f s" % report["wall_s"])
    if args.json:
        print(f"JSON: {args.json}")
    if opacus_info.get("error"):
        print(f"\n*** OPACUS STEPS SKIPPED: {opacus_info['error']} ***")
    if opacus_bad:
        print("\n*** OPACUS SELF-CHECK FAILED for %s (see selfcheck[].opacus in the JSON) ***" % ", ".join(opacus_bad))
    if opacus_failed:
        print("\n*** OPACUS MEASUREMENTS FAILED (recorded, not fatal):\n    " + "\n    ".join(opacus_failed))
    if bad_models:
        raise SystemExit("torch_step: self-check FAILED for %s (not timed)" % ", ".join(bad_models))
    if failed:
        raise SystemExit("torch_step: some eager measurements failed (see ERROR rows)")


def write_json(path, report):
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
