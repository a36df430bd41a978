"""Use a model trained by dpcluster outside it.

    import dpcluster
    m = dpcluster.load("model.safetensors")    # what `coordinator export` writes
    m.classes, m.features                       # names from the model's metadata
    m.predict_proba(x)                          # x: [N, *input] (or columns by name)
    m.to_torch()                                # a torch.nn.Module, if PyTorch is installed

Pure Python with numpy; PyTorch is optional. Every layer of dpcluster's CPU
engine runs here with the engine's semantics (engine.py says which).
Inputs are preprocessed as the training data was: image pixels scaled to
[0, 1] in [C, H, W] order, CSV features as given, text as token ids (-1 =
padding) of the tokenizer the model was trained with.
"""

import json

import numpy as np

from . import engine, safetensors
from .safetensors import SafetensorsError
from .spec import Model, SpecError

__all__ = ["load", "Predictor", "SafetensorsError", "SpecError"]


class Predictor:
    """A trained model: its spec, tensors and metadata, and its forward
    pass in numpy (float64)."""

    def __init__(self, tensors, metadata):
        if "spec" not in metadata:
            raise SpecError("no model spec in the file's metadata (not written by coordinator export?)")
        self.metadata = dict(metadata)
        self.spec = json.loads(metadata["spec"])
        self.model = Model(self.spec, tensors)
        self.input_shape = tuple(self.model.input)
        names = metadata.get("classes")
        self.classes = json.loads(names) if names else [str(i) for i in range(self.model.classes)]
        if len(self.classes) != self.model.classes:
            raise SpecError(f"the metadata names {len(self.classes)} classes, the spec has {self.model.classes}")
        features = metadata.get("features")
        self.features = json.loads(features) if features else None

    @property
    def next_token(self):
        """Whether the model predicts the next token at every position."""
        return self.model.loss == "next_token"

    def inputs(self, x):
        """x as a float64 array [N, *input]. x may be an array of that
        shape, of [N, prod(input)], one example of the input shape, or a
        mapping (a dict, a pandas DataFrame) from the model's feature names
        to columns, taken in the model's feature order."""
        if not isinstance(x, np.ndarray) and (hasattr(x, "keys") or hasattr(x, "columns")):
            if self.features is None:
                raise ValueError("the model names no features: give an array")
            missing = [f for f in self.features if f not in x]
            if missing:
                raise ValueError(f"no column {missing[0]!r}; the model reads {', '.join(self.features)}")
            x = np.stack([np.asarray(x[f], dtype=np.float64) for f in self.features], axis=1)
        x = np.asarray(x, dtype=np.float64)
        size = int(np.prod(self.input_shape))
        if x.shape == self.input_shape:
            x = x[None]
        if x.ndim < 1 or x.size % size != 0 or (x.ndim > 1 and int(np.prod(x.shape[1:])) != size):
            raise ValueError(f"inputs of shape {x.shape}: the model reads {size} values per example (input shape {list(self.input_shape)})")
        return x.reshape((-1,) + self.input_shape)

    def logits(self, x):
        """The model's outputs [N, classes] ([N, T, classes] for a
        next-token model), computed in float64."""
        return engine.logits(self.model, self.inputs(x))

    def predict_proba(self, x):
        """The softmax of the logits: each class's probability."""
        z = self.logits(x)
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def predict(self, x):
        """The arg-max class index of each example (the first maximum, as
        dpcluster counts it); self.classes names them."""
        return np.argmax(self.logits(x), axis=-1)

    def to_torch(self, dtype=None):
        """The model as a torch.nn.Module (float32 unless dtype says) with
        the same outputs as logits. Needs PyTorch."""
        import torch

        from .torch_module import DPClusterModule

        return DPClusterModule(self.model, dtype or torch.float32).eval()


def load(path):
    """Loads a model written by `coordinator export` (or a run's
    model.safetensors): a Predictor."""
    tensors, meta = safetensors.read(path)
    return Predictor(tensors, meta)
