#!/usr/bin/env python3
"""Classify the Fashion-MNIST test set with a model exported by dpcluster.

    coordinator local --max-steps 200 --data-dir /tmp/run1    # writes /tmp/run1/model.safetensors
    coordinator export /tmp/run1 --out model.safetensors       # or export any replica's data dir
    python3 examples/safetensors_classify.py model.safetensors

Needs only numpy (Debian: python3-numpy) and the Fashion-MNIST files (Debian:
dataset-fashion-mnist, in /usr/share/datasets/fashion-mnist; --data to use
another directory). It reads the safetensors file itself: an 8-byte
little-endian header length, a JSON header (each tensor's dtype, shape and
byte range in the data, plus "__metadata__"), then the raw little-endian
tensors. The model is rebuilt from the spec in the metadata ("spec"):
flatten, linear, relu and tanh layers; any other layer is refused.

Input preprocessing, as dpcluster's loader does it (dataset/idx.go): each
image is 28x28 bytes, scaled to float32 by dividing by 255 (values in
[0, 1]), flattened in row-major (C, H, W) order. No mean/std normalization.

Prints the metadata, then "correct K of N" and the accuracy K/N.
"""

import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2"}


def load_safetensors(path):
    """Returns ({name: array}, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n :]
    tensors = {}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        dt = np.dtype(DTYPES[e["dtype"]])
        arr = np.frombuffer(body[lo:hi], dtype=dt)
        tensors[name] = arr.reshape(e["shape"])
    return tensors, meta


def forward(spec, tensors, x):
    """Applies the spec's layers to a batch x of shape [N] + spec["input"]."""
    for i, layer in enumerate(spec["layers"]):
        kind = layer["type"]
        prefix = layer.get("name") or str(i)
        if kind == "flatten":
            x = x.reshape(x.shape[0], -1)
        elif kind == "linear":
            w = tensors[prefix + ".weight"].astype(np.float64)  # [out, in]
            b = tensors[prefix + ".bias"].astype(np.float64)
            x = x @ w.T + b
        elif kind == "relu":
            x = np.maximum(x, 0)
        elif kind == "tanh":
            x = np.tanh(x)
        else:
            sys.exit(f"layer {i} is {kind!r}: this example handles linear, relu, tanh and flatten only")
    return x


def read_idx(path):
    """Reads a (gzipped) IDX file of unsigned bytes: images [N, H, W] or labels [N]."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        sys.exit(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="safetensors file written by coordinator export")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="directory with the t10k-*.gz files")
    args = p.parse_args()

    tensors, meta = load_safetensors(args.model)
    spec = json.loads(meta["spec"])
    for k in ("run", "step", "epsilon", "delta", "accountant", "private"):
        print(f"{k}: {meta.get(k)}")
    if meta.get("private") != "true":
        print("WARNING: this model was trained with seeded noise: NOT differentially private")

    images = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(args.data, "t10k-labels-idx1-ubyte.gz"))
    x = (images.astype(np.float32) / 255).reshape([len(images)] + spec["input"])
    logits = forward(spec, tensors, x.astype(np.float64))
    pred = np.argmax(logits, axis=1)  # the first maximum, as dpcluster counts it
    correct = int(np.sum(pred == labels))
    print(f"correct {correct} of {len(labels)}")
    print(f"accuracy {correct / len(labels):.4f}")


if __name__ == "__main__":
    main()
