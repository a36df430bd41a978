"""A dpcluster model spec (the JSON in an exported model's "spec" metadata)
resolved into layers with their tensors.

The spec is the Go engine's (model/spec.go, model.LayerSpec): shapes are
written the PyTorch way ([C, H, W] images, linear weights [out, in], conv
weights [out, in, kh, kw]). A layer's tensors are named "<prefix>.<tensor>"
with prefix the layer's "name" or its index, and "<block>.<prefix>" inside
a residual block.
"""

LAYER_TYPES = (
    "linear", "relu", "tanh", "gelu", "gelu_tanh", "conv2d", "maxpool", "avgpool", "flatten",
    "embeddingbag", "layernorm", "embedding", "attention", "residual", "meanpool", "firsttoken", "lasttoken",
)

# The tensors of each layer type with parameters, in the engine's order.
TENSORS = {
    "conv2d": ("weight", "bias"),
    "embeddingbag": ("weight",),
    "layernorm": ("weight", "bias"),
}


class SpecError(ValueError):
    """The spec or the tensors do not make a model this package can run."""


class Layer:
    """One layer of a spec: its type, its spec fields (with the engine's
    defaults filled in) and its tensors (numpy arrays, by short name)."""

    def __init__(self, spec, prefix, tensors, depth):
        self.type = spec.get("type")
        if self.type not in LAYER_TYPES:
            raise SpecError(f"layer {prefix}: unknown layer type {self.type!r} (have {', '.join(LAYER_TYPES)})")
        self.prefix = prefix
        self.spec = dict(spec)
        self.kernel = spec.get("kernel", 0)
        self.pad = spec.get("pad", 0)
        if self.type == "conv2d":
            self.stride = spec.get("stride") or 1
        else:
            self.stride = spec.get("stride") or self.kernel
        self.eps = spec.get("eps") or 1e-5
        self.heads = spec.get("heads", 0)
        self.mask = spec.get("mask") or "causal"
        self.pos_offset = spec.get("pos_offset", 0)
        self.types = spec.get("types", 0)
        self.type_sep = spec.get("type_sep")
        self.layers = []
        if self.type == "residual":
            if depth > 0:
                raise SpecError(f"layer {prefix}: a residual block inside a residual block")
            for j, ls in enumerate(spec.get("layers") or []):
                self.layers.append(Layer(ls, prefix + "." + (ls.get("name") or str(j)), tensors, depth + 1))
            if not self.layers:
                raise SpecError(f"layer {prefix}: a residual block without layers")
        names = self.tensor_names()
        self.params = {}
        for n in names:
            key = prefix + "." + n
            if key not in tensors:
                raise SpecError(f"layer {prefix} ({self.type}): no tensor {key!r} in the file")
            self.params[n] = tensors[key]

    def tensor_names(self):
        if self.type == "linear":
            return ("weight",) if self.spec.get("no_bias") else ("weight", "bias")
        if self.type == "embedding":
            return ("weight", "pos", "types") if self.types > 0 else ("weight", "pos")
        return TENSORS.get(self.type, ())

    def all_tensor_keys(self):
        keys = [self.prefix + "." + n for n in self.params]
        for sub in self.layers:
            keys += sub.all_tensor_keys()
        return keys


class Model:
    """A resolved spec: input shape, classes, loss and layers."""

    def __init__(self, spec, tensors):
        self.spec = spec
        self.input = list(spec["input"])
        self.classes = int(spec["classes"])
        self.loss = spec.get("loss") or "softmax_cross_entropy"
        if self.loss not in ("softmax_cross_entropy", "next_token"):
            raise SpecError(f"unknown loss {self.loss!r}")
        self.layers = [Layer(ls, ls.get("name") or str(i), tensors, 0) for i, ls in enumerate(spec["layers"])]
        used = set()
        for layer in self.layers:
            used.update(layer.all_tensor_keys())
        extra = sorted(set(tensors) - used)
        if extra:
            raise SpecError(f"the file has tensors the spec does not use: {', '.join(extra[:5])}")
        self.first = self.layers[0].type if self.layers else None

    @property
    def tokens(self):
        """Whether the model's input is token ids (its first layer embeds them)."""
        return self.first in ("embedding", "embeddingbag")
