"""python3 -m dpcluster MODEL INPUT.npy [--out LOGITS.npy] [--torch]

Prints the model's classes and metadata, or, given INPUT.npy ([N, *input]
or [N, prod(input)]), writes its logits (float64) to --out, or prints each
example's predicted class. --torch computes them with the torch module
instead of numpy.
"""

import argparse
import sys

import numpy as np

from . import load


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m dpcluster", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a safetensors file written by coordinator export")
    p.add_argument("input", nargs="?", help="a .npy file of inputs")
    p.add_argument("--out", help="write the logits here (.npy, float64)")
    p.add_argument("--torch", action="store_true", help="compute with the torch module (needs PyTorch)")
    args = p.parse_args(argv)
    try:
        m = load(args.model)
    except (OSError, ValueError) as e:
        sys.exit(f"{args.model}: {e}")
    if args.input is None:
        print(f"classes: {m.classes}")
        print(f"features: {m.features}")
        print(f"input shape: {list(m.input_shape)}")
        for k in ("run", "step", "epsilon", "delta", "accountant", "private"):
            print(f"{k}: {m.metadata.get(k)}")
        return
    x = np.load(args.input)
    if args.torch:
        import torch

        module = m.to_torch(torch.float64)
        with torch.no_grad():
            z = module(torch.from_numpy(m.inputs(x))).numpy()
    else:
        z = m.logits(x)
    if args.out:
        np.save(args.out, z.astype(np.float64))
    else:
        for i, c in enumerate(np.argmax(z, axis=-1)):
            print(i, m.classes[c] if z.ndim == 2 else c.tolist())


if __name__ == "__main__":
    main()
