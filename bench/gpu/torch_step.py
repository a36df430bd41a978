#!/usr/bin/env python3
"""Time PyTorch on the GPU for the models of dpcluster's GPU benchmark (issue 16).

For each (model, batch size) it times, on one CUDA device:

  nonprivate  forward + softmax cross-entropy (mean over the batch) + backward,
              producing the mean gradient (torch.autograd.grad; no optimizer)
  dp          the clipped per-example gradient sum Σᵢ cᵢ∇ℓᵢ with
              cᵢ = min(1, C/(‖∇ℓᵢ‖ + 1e-12)), ℓᵢ example i's cross-entropy and
              the norm taken over ALL parameters (flat clipping): per-example
              gradients by torch.func (vmap(grad(loss)) over functional_call),
              per-example L2 norms, factors, and the weighted sum over the
              batch (einsum), giving the d-vector. No noise: a dpcluster node
              adds none (the coordinator does).

The models are dpcluster's presets, layer for layer and with the same
parameter names, shapes and order (model/spec.go, model/layers.go): the
d-vector's layout is the node's θ layout. "wide" is MLP([1,28,28],
[4096,4096], 10). Inputs are random normal [B,1,28,28] images and random
labels, already on the device: the times include neither the upload of the
batch nor the download of the result (a dpcluster node does both every step).
Every timed step is synchronized before the next starts, as a node's step is.

Strict float32 is the default (TF32 off for cuBLAS and cuDNN; a numeric probe
checks it); --tf32 also times with TF32 on. A self-check runs first: the dp
step in float64 against a loop over examples (per-example backward, clip,
sum); the script exits non-zero if it fails.

Usage (see bench/gpu/README.md):

  python3 bench/gpu/torch_step.py [--tf32] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import subprocess
import sys
import time
import warnings

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.func import functional_call, grad, vmap
except ImportError:  # the pure-Python helpers below still import
    torch = None

# ---------------------------------------------------------------- models

INPUT = (1, 28, 28)  # per-example input [C, H, W], as Preset's
CLASSES = 10

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
EXPECTED_PARAMS = {"mlp": 269322, "cnn": 26010, "wide": 20037642}

DEFAULT_BATCH = {"mlp": 256, "cnn": 256, "wide": 1024}


def plan(layers, input_shape):
    """Infer shapes the way model/layers.go does.

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
        else:
            raise ValueError(f"layer {i}: unsupported layer type {t!r}")
        shapes.append(shape)
    return params, shapes


def count_params(params):
    return sum(math.prod(shape) for _, shape in params)


def build_model(name):
    """The PyTorch module for a spec: an nn.Sequential whose indices are the
    spec's layer indices, so its parameter names ("1.weight") are the Go
    model's. PyTorch's default initialization, U(±1/√fan_in) for weights and
    biases (fan_in = in, or C·k·k for a convolution), is the Go model's
    uniformInit."""
    layers = SPECS[name]
    _, shapes = plan(layers, INPUT)
    mods = []
    shape = INPUT
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
        else:
            raise ValueError(f"layer {i}: unsupported layer type {t!r}")
        shape = shapes[i]
    if shape != (CLASSES,):
        raise ValueError(f"{name}: last layer gives {shape}, want ({CLASSES},)")
    return nn.Sequential(*mods)


def check_model(name, model):
    """The module's parameters must be the spec's, in name, shape and order,
    and their count the Go model's. Returns the count."""
    want, _ = plan(SPECS[name], INPUT)
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


def self_check(name, device, seed):
    """The dp step (as timed, and with chunking) against a loop over
    examples: per-example backward, clip, sum, all in float64; the
    nonprivate step against the mean of the per-example gradients; then the
    fp32 dp step against the same float64 reference. Returns a dict of
    errors and passes."""
    B = 8
    torch.manual_seed(seed)
    m64 = build_model(name).to(device=device, dtype=torch.float64)
    check_model(name, m64)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((B, *INPUT), device=device, dtype=torch.float64, generator=gen)
    y = torch.randint(0, CLASSES, (B,), device=device, generator=gen)

    params = list(m64.parameters())
    per = []
    for i in range(B):
        loss = F.cross_entropy(m64(x[i:i + 1]), y[i:i + 1], reduction="sum")
        per.append(flatten(torch.autograd.grad(loss, params)))
    norms = sorted(torch.linalg.vector_norm(v).item() for v in per)
    # A clip norm between the 4th and 5th smallest norms: half the examples
    # are clipped, half are not.
    clip = (norms[B // 2 - 1] + norms[B // 2]) / 2
    ref = torch.zeros_like(per[0])
    clipped = 0
    for v in per:
        n = torch.linalg.vector_norm(v).item()
        c = min(1.0, clip / (n + 1e-12))
        clipped += c < 1.0
        ref += c * v
    mean_ref = torch.stack(per).mean(dim=0)

    res = {"model": name, "B": B, "clip": clip, "clipped": int(clipped)}
    res["dp_f64_rel_err"] = rel_err(make_dp_step(m64, clip, B)(x, y), ref)
    res["dp_f64_chunk3_rel_err"] = rel_err(make_dp_step(m64, clip, 3)(x, y), ref)
    res["nonprivate_f64_rel_err"] = max(
        rel_err(flatten(make_nonprivate_step(m64, functional)(x, y)), mean_ref) for functional in (False, True))
    m32 = copy.deepcopy(m64).float()
    res["dp_f32_rel_err"] = rel_err(make_dp_step(m32, clip, B)(x.float(), y), ref)
    res["ok"] = (0 < clipped < B
                 and res["dp_f64_rel_err"] < SELFCHECK_TOL64
                 and res["dp_f64_chunk3_rel_err"] < SELFCHECK_TOL64
                 and res["nonprivate_f64_rel_err"] < SELFCHECK_TOL64
                 and res["dp_f32_rel_err"] < SELFCHECK_TOL32)
    return res


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


def make_batches(batch, count, gen, device):
    return [(torch.randn((batch, *INPUT), device=device, generator=gen),
             torch.randint(0, CLASSES, (batch,), device=device, generator=gen))
            for _ in range(count)]


def run_step(fn, x, y, graphs):
    if graphs and hasattr(torch, "compiler") and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
        torch.compiler.cudagraph_mark_step_begin()
    return fn(x, y)


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


def bench_config(name, batch, prec, args, device, total_mem):
    """Times every step and variant of one (model, B, precision); returns
    result rows."""
    torch.manual_seed(args.seed)
    model = build_model(name).to(device)
    n_params = check_model(name, model)
    chunk = dp_chunk(batch, n_params, total_mem, args.dp_mem_frac, args.dp_chunk)
    base = {"model": name, "params": n_params, "B": batch, "precision": prec}

    variants = [("eager", {s: (make_nonprivate_step(model) if s == "nonprivate"
                               else make_dp_step(model, args.clip, chunk))
                           for s in args.steps})]
    if args.compile != "none":
        variants.append((f"compile:{args.compile}",
                         {s: torch.compile(make_nonprivate_step(model, functional=True) if s == "nonprivate"
                                           else variants[0][1][s], mode=args.compile)
                          for s in args.steps}))

    rows = []
    gen = torch.Generator(device=device).manual_seed(args.seed + batch)
    for vname, fns in variants:
        compiled = vname != "eager"
        graphs = compiled and args.compile == "reduce-overhead"  # CUDA graph trees
        live = {}
        for s, fn in fns.items():
            row = dict(base, step=s, variant=vname)
            if s == "dp":
                row["dp_chunk"] = chunk
                row["impl"] = "torch.func vmap(grad)"
            else:
                row["impl"] = "torch.func.grad" if compiled else "torch.autograd.grad"
            try:
                batches = make_batches(batch, args.batches, gen, device)
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
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                print(f"  {name} B={batch} {prec} {s} {vname}: {row['error']}", flush=True)
                rows.append(row)
        ev = {s: [] for s in live}
        wall = {s: [] for s in live}
        failed = set()
        for r in range(args.repeats):
            # Fresh data each round; alternate which step goes first.
            batches = make_batches(batch, args.batches, gen, device)
            order = list(live) if r % 2 == 0 else list(reversed(live))
            for s in order:
                if s in failed:
                    continue
                try:
                    e, w = time_step(fns[s], batches, args.iters, graphs)
                    ev[s] += e
                    wall[s] += w
                except Exception as exc:
                    live[s]["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
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
    # dp ÷ nonprivate, per variant, from the medians.
    for row in rows:
        if row["step"] == "dp" and "median_ms" in row:
            np_row = next((r for r in rows if r["step"] == "nonprivate"
                           and r["variant"] == row["variant"] and "median_ms" in r), None)
            if np_row:
                row["dp_over_nonprivate"] = row["median_ms"] / np_row["median_ms"]
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


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp,cnn,wide",
                   help="comma-separated, of %s (default %%(default)s)" % ",".join(SPECS))
    p.add_argument("--batch-sizes", default="",
                   help="comma-separated batch sizes run for every model "
                        "(default: mlp 256, cnn 256, wide 1024)")
    p.add_argument("--steps", default="nonprivate,dp", help="comma-separated, of nonprivate,dp")
    p.add_argument("--tf32", action="store_true", help="also time with TF32 on (labelled tf32)")
    p.add_argument("--tf32-only", action="store_true", help="time with TF32 on only")
    p.add_argument("--clip", type=float, default=1.0, help="clip norm C (default 1)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first, ≥ 10 (default 20)")
    p.add_argument("--iters", type=int, default=50, help="timed steps per round, ≥ 50 (default 50)")
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds, each on fresh batches, steps alternating (default 3)")
    p.add_argument("--batches", type=int, default=4, help="batches on the device to rotate over (default 4)")
    p.add_argument("--dp-chunk", type=int, default=0,
                   help="examples per vmap chunk (default: as many as fit --dp-mem-frac)")
    p.add_argument("--dp-mem-frac", type=float, default=0.25,
                   help="device memory share for a chunk's per-example gradients (default 0.25)")
    p.add_argument("--compile", default="reduce-overhead",
                   choices=["none", "default", "reduce-overhead", "max-autotune"],
                   help="also time the steps under torch.compile with this mode, or none "
                        "(default %(default)s: CUDA graphs, no launch overhead)")
    p.add_argument("--no-cudnn-benchmark", action="store_true", help="leave cuDNN autotuning off")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="", help="write every number to this JSON file")
    a = p.parse_args(argv)

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
    if not a.steps or any(s not in ("nonprivate", "dp") for s in a.steps):
        p.error("--steps: a comma-separated list of nonprivate, dp")
    if a.warmup < 10:
        p.error("--warmup must be ≥ 10")
    if a.iters < 50:
        p.error("--iters must be ≥ 50")
    if a.repeats < 1 or a.batches < 1:
        p.error("--repeats and --batches must be ≥ 1")
    if not (a.clip > 0 and math.isfinite(a.clip)):
        p.error("--clip must be positive and finite")
    if a.dp_chunk < 0 or not (0 < a.dp_mem_frac <= 1):
        p.error("--dp-chunk must be ≥ 0 and --dp-mem-frac in (0, 1]")
    a.precisions = ["tf32"] if a.tf32_only else (["fp32", "tf32"] if a.tf32 else ["fp32"])
    return a


def fmt(v, width, prec=3):
    return f"{v:>{width}.{prec}f}" if isinstance(v, float) else f"{v!s:>{width}}"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if torch is None:
        raise SystemExit("torch_step: PyTorch is not installed")
    if not torch.cuda.is_available():
        raise SystemExit("torch_step: no CUDA device")
    device = torch.device(args.device)
    # Inductor's advice to turn TF32 on: strict float32 is deliberate here
    # (the probe below checks it).
    warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark

    env, total_mem = environment(device)
    print("torch %s (CUDA %s, cuDNN %s), Python %s" % (env["torch"], env["torch_cuda"], env["cudnn"], env["python"]))
    print("GPU: %s, compute capability %s, %d SMs, %.1f GiB, driver %s"
          % (env["gpu"], env["capability"], env["sms"], env["gpu_mem_gib"], env["driver"]))
    print("Data is already on the device: no host→device upload of x, y and no download "
          "of the result is timed. Each timed step is synchronized.", flush=True)

    report = {"env": env, "args": {k: v for k, v in vars(args).items()},
              "notes": ["inputs on the device already (no upload/download timed)",
                        "each step synchronized; event time is the primary figure",
                        "dp: torch.func vmap(grad) per-example gradients, flat L2 clipping "
                        "min(1, C/(norm+1e-12)), einsum sum; no noise"],
              "selfcheck": [], "precision": {}, "results": []}

    # Self-check, strict float32 (it also checks the fp32 dp step).
    set_precision("fp32")
    ok = True
    for name in ["mlp"] + [m for m in ("cnn", "wide") if m in args.models]:
        res = self_check(name, device, args.seed)
        report["selfcheck"].append(res)
        print("self-check %-4s B=8 C=%.4g (%d of 8 clipped): dp f64 %.2e, dp f64 chunk 3 %.2e, "
              "nonprivate f64 %.2e, dp f32 %.2e: %s"
              % (name, res["clip"], res["clipped"], res["dp_f64_rel_err"], res["dp_f64_chunk3_rel_err"],
                 res["nonprivate_f64_rel_err"], res["dp_f32_rel_err"], "ok" if res["ok"] else "FAIL"),
              flush=True)
        ok = ok and res["ok"]
    if not ok:
        if args.json:
            write_json(args.json, report)
        raise SystemExit("torch_step: self-check FAILED (bounds: %g in float64, %g for the fp32 dp step)"
                         % (SELFCHECK_TOL64, SELFCHECK_TOL32))

    failed = False
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
        for name in args.models:
            for batch in (args.batch_sizes or [DEFAULT_BATCH[name]]):
                print(f"[{prec}] {name} B={batch} ...", flush=True)
                rows = bench_config(name, batch, prec, args, device, total_mem)
                if args.compile != "none":
                    # Drop compiled code and CUDA graph pools: the next
                    # configuration compiles afresh (no recompile limit hit,
                    # no memory carried over into its peak).
                    torch.compiler.reset()
                torch.cuda.empty_cache()
                for r in rows:
                    if "error" in r:
                        failed = failed or r["variant"] == "eager"
                    else:
                        print("  %-10s %-8s median %.3f ms (p10 %.3f, p90 %.3f), %.1f steps/s, wall %.3f ms%s"
                              % (r["step"], r["variant"], r["median_ms"], r["p10_ms"], r["p90_ms"],
                                 r["steps_per_s"], r["wall_median_ms"],
                                 f", dp/nonprivate {r['dp_over_nonprivate']:.2f}" if "dp_over_nonprivate" in r else ""),
                              flush=True)
                report["results"] += rows
    if args.json:
        write_json(args.json, report)

    print("\nPyTorch %s on %s; data on device; per-step medians of %d×%d synchronized steps"
          % (env["torch"], env["gpu"], args.repeats, args.iters))
    head = ("model", "B", "prec", "step", "variant", "chunk", "median_ms", "p10_ms", "p90_ms", "steps/s", "ex/s", "dp/np")
    widths = (5, 5, 5, 10, 23, 5, 10, 9, 9, 9, 10, 6)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
    for r in report["results"]:
        if "error" in r:
            print(" ".join(fmt(v, w) for v, w in zip((r["model"], r["B"], r["precision"], r["step"], r["variant"]),
                                                       widths)) + "  ERROR " + r["error"])
            continue
        vals = (r["model"], r["B"], r["precision"], r["step"], r["variant"], r.get("dp_chunk", "-"),
                r["median_ms"], r["p10_ms"], r["p90_ms"], r["steps_per_s"], r["examples_per_s"],
                r.get("dp_over_nonprivate", "-"))
        cells = []
        for v, w, k in zip(vals, widths, head):
            if k in ("steps/s", "ex/s"):
                cells.append(f"{v:>{w}.0f}")
            elif k == "dp/np" and isinstance(v, float):
                cells.append(f"{v:>{w}.2f}")
            else:
                cells.append(fmt(v, w))
        print(" ".join(cells))
    if args.json:
        print(f"JSON: {args.json}")
    if failed:
        raise SystemExit("torch_step: some eager measurements failed (see ERROR rows)")


def write_json(path, report):
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
