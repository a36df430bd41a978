"""Unit tests of the dpcluster package: python3 -m unittest (from python/).

The comparison with dpcluster's own engine, on every preset and layer, is
the Go test TestPythonPackageMatchesEngine (cli/pypackage_test.go); these
check what it does not: inputs by column name, hand-computed edge cases of
the sequence layers, and the errors.
"""

import json
import math
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import dpcluster  # noqa: E402
from dpcluster import engine  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def safetensors_bytes(tensors, meta):
    """A safetensors file of float32 tensors, as dpcluster writes it."""
    header, body, off = {"__metadata__": meta}, b"", 0
    for name, a in tensors.items():
        raw = np.asarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(np.shape(a)), "data_offsets": [off, off + len(raw)]}
        body += raw
        off += len(raw)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


def write_model(dirname, spec, tensors, **meta):
    path = os.path.join(dirname, "model.safetensors")
    with open(path, "wb") as f:
        f.write(safetensors_bytes(tensors, dict(meta, spec=json.dumps(spec))))
    return path


class PackageTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def test_columns_by_name(self):
        spec = {"input": [3], "classes": 2, "layers": [{"type": "linear", "out": 2}]}
        w = np.array([[1.0, 0, 0], [0, 0, 1]])
        path = write_model(self.dir, spec, {"0.weight": w, "0.bias": [0.5, 0]},
                           classes='["no", "yes"]', features='["a", "b", "c"]')
        m = dpcluster.load(path)
        self.assertEqual(m.classes, ["no", "yes"])
        self.assertEqual(m.features, ["a", "b", "c"])
        cols = {"c": [2.0, 0.0], "b": [9.0, 9.0], "a": [1.0, 1.0]}
        np.testing.assert_allclose(m.logits(cols), [[1.5, 2.0], [1.5, 0.0]])
        self.assertEqual(m.predict(cols).tolist(), [1, 0])
        np.testing.assert_allclose(m.predict_proba(cols).sum(axis=1), [1, 1])
        np.testing.assert_allclose(m.logits([1.0, 9.0, 2.0]), [[1.5, 2.0]])  # one example
        with self.assertRaisesRegex(ValueError, "no column 'c'"):
            m.logits({"a": [1.0], "b": [2.0]})
        with self.assertRaisesRegex(ValueError, "reads 3 values per example"):
            m.logits(np.zeros((2, 4)))

    def test_integer_classes_without_names(self):
        spec = {"input": [1, 2, 2], "classes": 3, "layers": [{"type": "flatten"}, {"type": "linear", "out": 3}]}
        path = write_model(self.dir, spec, {"1.weight": np.eye(3, 4), "1.bias": np.zeros(3)})
        m = dpcluster.load(path)
        self.assertEqual(m.classes, ["0", "1", "2"])
        self.assertIsNone(m.features)
        # flatten reads C, H, W order: [c0 h0 w0, c0 h0 w1, c0 h1 w0, ...]
        np.testing.assert_allclose(m.logits(np.arange(4.0).reshape(1, 1, 2, 2)), [[0, 1, 2]])

    def test_errors(self):
        spec = {"input": [2], "classes": 2, "layers": [{"type": "linear", "out": 2}]}
        with self.assertRaisesRegex(dpcluster.SpecError, "no tensor '0.bias'"):
            dpcluster.load(write_model(self.dir, spec, {"0.weight": np.eye(2)}))
        with self.assertRaisesRegex(dpcluster.SpecError, "unknown layer type 'dropout'"):
            dpcluster.load(write_model(self.dir, {"input": [2], "classes": 2, "layers": [{"type": "dropout"}]}, {}))
        with self.assertRaisesRegex(dpcluster.SpecError, "does not use: extra"):
            dpcluster.load(write_model(self.dir, spec, {"0.weight": np.eye(2), "0.bias": [0, 0], "extra": [1.0]}))
        with self.assertRaisesRegex(dpcluster.SpecError, "names 3 classes"):
            dpcluster.load(write_model(self.dir, spec, {"0.weight": np.eye(2), "0.bias": [0, 0]}, classes='["a","b","c"]'))
        path = os.path.join(self.dir, "x.safetensors")
        with open(path, "wb") as f:
            f.write(b"label,a\n1,2\n")
        with self.assertRaises(dpcluster.SafetensorsError):
            dpcluster.load(path)

    def test_sequence_edge_cases(self):
        # Token types: the number of [SEP] (id 3) before each position, capped.
        ids = np.array([[2, 5, 3, 6, 3, 7, -1], [3, 3, 3, 3, -1, -1, -1]])
        self.assertEqual(engine.token_types(ids, 2, 3).tolist(), [[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1]])
        self.assertEqual(engine.last_positions(np.array([[1, 2, -1], [-1, -1, -1], [-1, 4, -1]])).tolist(), [1, 0, 1])
        # Padding attention: keys are the non-padding positions; a query of
        # an example without any outputs zeros.
        spec = {"input": [3], "classes": 2, "layers": [
            {"type": "embedding", "vocab": 4, "dim": 6},
            {"type": "attention", "heads": 2, "mask": "padding"},
            {"type": "meanpool"}, {"type": "linear", "out": 2}]}
        rng = np.random.default_rng(1)
        tensors = {"0.weight": rng.normal(size=(4, 6)), "0.pos": rng.normal(size=(3, 6)),
                   "3.weight": rng.normal(size=(2, 2)), "3.bias": [0.25, -0.5]}
        m = dpcluster.load(write_model(self.dir, spec, tensors))
        np.testing.assert_allclose(m.logits([[-1, -1, -1]]), [[0.25, -0.5]], atol=1e-7)
        x = np.array([[1, -1, 2]])
        got = m.logits(x)
        # By hand: the embedding rows, one head of width 1 per D = 2.
        w, pos = tensors["0.weight"].astype(np.float32), tensors["0.pos"].astype(np.float32)
        e = np.stack([w[1] + pos[0], pos[1], w[2] + pos[2]]).astype(np.float64)
        out = np.zeros((3, 2))
        for h in range(2):
            q, k, v = e[:, h], e[:, 2 + h], e[:, 4 + h]
            for t in range(3):
                s = np.array([q[t] * k[u] for u in (0, 2)])
                p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
                out[t, h] = p[0] * v[0] + p[1] * v[2]
        want = out.mean(axis=0) @ tensors["3.weight"].astype(np.float32).T + np.array([0.25, -0.5])
        np.testing.assert_allclose(got[0], want, rtol=1e-6)
        if torch is not None:
            with torch.no_grad():
                tz = m.to_torch(torch.float64)(torch.tensor(x, dtype=torch.float64)).numpy()
            np.testing.assert_allclose(tz, got, rtol=1e-9)

    def test_gelu(self):
        x = np.array([-3.0, -0.5, 0.0, 0.7, 4.0])
        np.testing.assert_allclose(engine.gelu(x), [v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
        self.assertLess(np.abs(engine.gelu(x) - engine.gelu_tanh(x)).max(), 1e-3)


if __name__ == "__main__":
    unittest.main()
