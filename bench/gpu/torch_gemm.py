#!/usr/bin/env python3
"""cuBLAS (through torch.matmul / torch.bmm) on the wide MLP's products at
B = 1024, the shapes of BenchmarkCUDASgemm in model/cuda_test.go, strict
float32 (TF32 off), so that our GEMM kernels' TFLOP/s can be set against the
vendor library's on the same GPU in the same call.

    python3 bench/gpu/torch_gemm.py --json gemm.json

Each product: 10 warm-up runs, then 50 timed with CUDA events; the median
is reported as ms and TFLOP/s (2·m·n·k per product, summed over blocks).
"""
import argparse
import json
import statistics

import torch

B = 1024
BLOCK = 256  # model/layer.go blockRows
# name, variant, m, n, k, block (as in BenchmarkCUDASgemm)
SHAPES = [
    ("fwd1-nt", "nt", B, 4096, 784, 0),
    ("fwd2-nt", "nt", B, 4096, 4096, 0),
    ("dx2-nn", "nn", B, 4096, 4096, 0),
    ("acc2-tn", "tn", 4096, 4096, B, BLOCK),
    ("acc1-tn", "tn", 4096, 784, B, BLOCK),
]


def product(variant, m, n, k, block, dev):
    """Returns a closure computing the product with operands laid out as
    our engine lays them out (row-major, transposes as views)."""
    if variant == "tn":  # C_z = D_zᵀ A_z over blocks of rows: D [k, m], A [k, n]
        nz = k // block if block else 1
        kb = block or k
        d = torch.randn(nz, kb, m, device=dev)
        a = torch.randn(nz, kb, n, device=dev)
        return lambda: torch.bmm(d.transpose(1, 2), a)
    x = torch.randn(m, k, device=dev)
    if variant == "nt":  # X [m, k] · W [n, k]ᵀ
        w = torch.randn(n, k, device=dev)
        return lambda: x @ w.t()
    w = torch.randn(k, n, device=dev)  # nn: D [m, k] · W [k, n]
    return lambda: x @ w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device("cuda:0")
    out = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
           "tf32": False, "products": []}
    for name, variant, m, n, k, block in SHAPES:
        f = product(variant, m, n, k, block, dev)
        for _ in range(10):
            f()
        times = []
        for _ in range(args.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            f()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        ms = statistics.median(times)
        tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12
        out["products"].append({"name": name, "variant": variant, "m": m, "n": n, "k": k, "block": block,
                                "ms": ms, "tflops": tflops})
        print(f"{name:10s} {variant} {m}x{n}x{k} block {block}: {ms:.3f} ms {tflops:.1f} TFLOP/s", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
