#!/usr/bin/env python3
"""Checks of torch_step.py that need neither PyTorch nor a GPU.

  python3 bench/gpu/selftest_torch_step.py [OPACUS_PATH]

1. The pure-Python helpers: parameter counts of every model from its spec
   (plan) against EXPECTED_PARAMS, percentiles, argument defaults and
   --quick.
2. import_opacus against the Opacus source in OPACUS_PATH (default
   gpu-carry, from the repository root), in a child process where a fake
   "torch" package stands in for PyTorch (every attribute a dummy class)
   and numpy and torch.distributed._tensor are made missing: the Opacus
   modules the benchmark uses must import from torch and the standard
   library alone, with the stubs import_opacus puts in (numpy,
   torch.distributed._tensor[.experimental]) and without
   opacus/__init__.py, the privacy engine, the accountants or scipy. It
   cannot check that the Opacus code runs (that needs PyTorch).
"""

import abc
import importlib.abc
import importlib.machinery
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def check_helpers():
    sys.path.insert(0, HERE)
    import torch_step as ts

    assert ts.torch is None or True  # imports with or without torch
    for name in ts.SPECS:
        params, shapes = ts.plan(ts.SPECS[name], ts.INPUTS[name])
        n = ts.count_params(params)
        assert n == ts.EXPECTED_PARAMS[name], (name, n)
        assert shapes[-1] == (ts.NUM_CLASSES[name],), (name, shapes[-1])
    tb, _ = ts.plan(ts.SPECS["textbag"], ts.INPUTS["textbag"])
    assert tb == [("0.weight", (10000, 64)), ("1.weight", (64, 64)), ("1.bias", (64,)),
                  ("3.weight", (4, 64)), ("3.bias", (4,))], tb
    assert ts.EXPECTED_PARAMS["textbag"] == 10000 * 64 + 64 * 64 + 64 + 4 * 64 + 4 == 644420

    assert ts.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert ts.percentile([5.0], 90) == 5.0
    s = ts.summarize([3.0, 1.0, 2.0])
    assert s["median_ms"] == 2.0 and s["min_ms"] == 1.0 and s["n"] == 3

    a = ts.parse_args([])
    assert (a.warmup, a.iters, a.repeats) == (20, 50, 3)
    assert a.models == ["mlp", "cnn", "textbag", "wide"]
    assert a.steps == list(ts.STEPS)
    assert a.compile_models == a.models and a.compile_steps == ["nonprivate", "dp"]
    q = ts.parse_args(["--quick", "--models", "textbag,mlp"])
    assert (q.warmup, q.iters, q.repeats) == (5, 20, 2)
    assert q.compile_models == ["mlp"] and q.compile_steps == ["dp"] and q.models == ["textbag", "mlp"]
    q2 = ts.parse_args(["--quick", "--iters", "30", "--compile-models", "mlp,cnn", "--compile-steps", "nonprivate,dp"])
    assert q2.iters == 30 and q2.warmup == 5 and q2.compile_models == ["mlp", "cnn"]
    assert q2.compile_steps == ["nonprivate", "dp"]
    for bad in (["--iters", "20"], ["--steps", "dp,opacus"], ["--models", "lstm"], ["--compile-steps", "opacus_ghost"]):
        try:
            with open(os.devnull, "w") as devnull:
                old, sys.stderr = sys.stderr, devnull
                try:
                    ts.parse_args(bad)
                finally:
                    sys.stderr = old
        except SystemExit:
            continue
        raise AssertionError(f"parse_args accepted {bad}")
    print("helpers: ok")


# ---------------------------------------------------------------- fake torch


class FakeMeta(abc.ABCMeta):
    # An ABCMeta, so classes may derive from a fake class and ABC at once.
    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return fake_class(attr)


class FakeBase(metaclass=FakeMeta):
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        # a decorator (torch.no_grad()) gives back what it decorates
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return FakeBase()

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return fake_class(attr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_classes = {}


def fake_class(name):
    if name not in _classes:
        _classes[name] = FakeMeta(name, (FakeBase,), {})
    return _classes[name]


class FakeTorchFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """torch and every torch.* module as fake packages, except those in
    missing; numpy missing too."""

    missing = {"numpy", "torch.distributed._tensor"}

    def find_spec(self, name, path=None, target=None):
        if name in self.missing or any(name.startswith(m + ".") for m in self.missing):
            raise ModuleNotFoundError(f"No module named {name!r} (fake)", name=name)
        if name == "torch" or name.startswith("torch."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__version__ = "0.0.fake"
        module.__getattr__ = lambda attr: _module_getattr(attr)


def _module_getattr(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return fake_class(attr)


def child(opacus_path):
    before = set(sys.modules)  # the interpreter's own (site, .pth files)
    sys.meta_path.insert(0, FakeTorchFinder())
    sys.path.insert(0, HERE)
    import torch_step as ts

    assert ts.torch is not None and ts.torch.__version__ == "0.0.fake"
    info = {}
    op = ts.import_opacus(opacus_path, info)
    for k in ("GradSampleModule", "GradSampleModuleFastGradientClipping", "DPOptimizer",
              "DPOptimizerFastGradientClipping", "DPLossFastGradientClipping"):
        cls = getattr(op, k)
        assert cls.__name__ == k and cls.__module__.startswith("opacus."), (k, cls)
    assert info["version"] and info["path"].endswith("opacus"), info
    assert info["stubs"] == ["numpy", "torch.distributed._tensor", "torch.distributed._tensor.experimental"], info
    for m in ("numpy", "scipy", "opacus.privacy_engine", "opacus.accountants", "opacus.data_loader",
              "torch.distributed._tensor"):
        assert m not in sys.modules, f"{m} is loaded"
    # The stubs stay where Opacus uses them.
    assert sys.modules["opacus.grad_sample.conv"].np.prod((4, 4)) == 16
    assert "opacus.grad_sample.embedding" in sys.modules and "opacus.grad_sample.linear" in sys.modules
    assert not hasattr(sys.modules["opacus"], "PrivacyEngine")  # opacus/__init__.py did not run
    loaded = sorted(k for k in sys.modules if k.startswith("opacus"))
    others = sorted(k.split(".")[0] for k in set(sys.modules) - before
                    if not k.startswith(("opacus", "torch", "torch_step")) and k.split(".")[0] not in sys.stdlib_module_names)
    assert not others, f"non-stdlib modules loaded: {sorted(set(others))}"
    print("import_opacus: ok: Opacus %s, commit %s, stubs %s, %d opacus modules loaded"
          % (info["version"], info["commit"], ", ".join(info["stubs"]), len(loaded)))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    opacus_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "gpu-carry")
    check_helpers()
    if not os.path.isdir(os.path.join(opacus_path, "opacus")):
        print(f"import_opacus: skipped (no opacus package under {opacus_path})")
        return
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", opacus_path])
    if r.returncode:
        raise SystemExit("import_opacus check FAILED")


if __name__ == "__main__":
    main()
