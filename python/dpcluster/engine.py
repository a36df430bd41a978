"""The forward pass of a dpcluster model in numpy (float64), with the Go
engine's semantics (model/*.go):

- activations are [N, C, H, W] for images, [N, T, D] for sequences and
  [N, F] otherwise; flatten takes C, H, W order;
- token ids are floats holding integers, -1 is padding: an embedding bag
  averages the embeddings of the other tokens (zero if none), an embedding
  embeds padding as zero (its position and type rows are still added);
- attention's input holds each position's query, key and value ([T, 3D]),
  its keys are u <= t (causal) or the positions whose input token is not
  padding (padding; a query without keys outputs zeros), scores are
  scaled by 1/sqrt(head size); it has no parameters;
- lasttoken takes the last position whose input token is not padding
  (position 0 if all are); meanpool averages all T positions;
- a next-token model's input is [T+1] ids, of which the layers see the
  first T, and its output is [T, classes].
"""

import math

import numpy as np

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def gelu(x):
    """x * Phi(x), Phi the standard normal CDF."""
    return x * 0.5 * _erfc(-x / math.sqrt(2))


def gelu_tanh(x):
    """GELU's tanh approximation (GPT-2's)."""
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _windows(x, k, s):
    """The k x k windows of x [N, C, H, W] at stride s: [N, C, Ho, Wo, k, k]."""
    w = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    return w[:, :, ::s, ::s]


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def token_types(ids, n_types, sep):
    """Each position's token type: the number of sep ids before it, capped
    at n_types - 1 (BERT's segments)."""
    n, t = ids.shape
    out = np.zeros((n, t), dtype=np.int64)
    if n_types < 2:
        return out
    k = np.zeros(n, dtype=np.int64)
    for i in range(t):
        out[:, i] = k
        k = np.where((ids[:, i] == sep) & (k < n_types - 1), k + 1, k)
    return out


def last_positions(ids):
    """Each example's last position whose id is not padding, 0 if none."""
    valid = ids >= 0
    t = ids.shape[1]
    last = t - 1 - np.argmax(valid[:, ::-1], axis=1)
    return np.where(valid.any(axis=1), last, 0)


def layer_forward(layer, x, ids):
    """Applies one layer (spec.Layer) to x; ids are the model's input ids
    (for padding masks and lasttoken), or None."""
    p = {k: _f64(v) for k, v in layer.params.items()}
    t = layer.type
    if t == "linear":
        y = x @ p["weight"].T
        return y + p["bias"] if "bias" in p else y
    if t == "relu":
        return np.maximum(x, 0)
    if t == "tanh":
        return np.tanh(x)
    if t == "gelu":
        return gelu(x)
    if t == "gelu_tanh":
        return gelu_tanh(x)
    if t == "flatten":
        return x.reshape(x.shape[0], -1)
    if t == "conv2d":
        k, s, pad = layer.kernel, layer.stride, layer.pad
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        y = np.einsum("nchwij,ocij->nohw", _windows(xp, k, s), p["weight"], optimize=True)
        return y + p["bias"][None, :, None, None]
    if t in ("maxpool", "avgpool"):
        w = _windows(x, layer.kernel, layer.stride)
        return w.max(axis=(-2, -1)) if t == "maxpool" else w.mean(axis=(-2, -1))
    if t == "layernorm":
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + layer.eps) * p["weight"] + p["bias"]
    if t == "embeddingbag":
        idx = x.astype(np.int64)
        valid = idx >= 0
        e = p["weight"][np.where(valid, idx, 0)] * valid[..., None]
        n = valid.sum(axis=1, keepdims=True)
        return e.sum(axis=1) / np.maximum(n, 1)
    if t == "embedding":
        idx = x.astype(np.int64)
        T = idx.shape[1]
        valid = idx >= 0
        y = p["weight"][np.where(valid, idx, 0)] * valid[..., None]
        y = y + p["pos"][layer.pos_offset : layer.pos_offset + T][None]
        if layer.types > 0:
            sep = layer.type_sep if layer.type_sep is not None else -2
            y = y + p["types"][token_types(idx, layer.types, sep)]
        return y
    if t == "attention":
        n, T, d3 = x.shape
        d = d3 // 3
        h = layer.heads
        dh = d // h
        q = x[..., :d].reshape(n, T, h, dh).transpose(0, 2, 1, 3)
        k = x[..., d : 2 * d].reshape(n, T, h, dh).transpose(0, 2, 1, 3)
        v = x[..., 2 * d :].reshape(n, T, h, dh).transpose(0, 2, 1, 3)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)  # [n, h, T, T]
        if layer.mask == "padding":
            allowed = np.broadcast_to((ids >= 0)[:, None, None, :], scores.shape)
        else:
            allowed = np.broadcast_to(np.tril(np.ones((T, T), dtype=bool)), scores.shape)
        scores = np.where(allowed, scores, -np.inf)
        mx = scores.max(axis=-1, keepdims=True)
        e = np.where(allowed, np.exp(scores - np.where(np.isfinite(mx), mx, 0)), 0)
        tot = e.sum(axis=-1, keepdims=True)
        probs = e / np.where(tot > 0, tot, 1)  # a query without keys: zeros
        return (probs @ v).transpose(0, 2, 1, 3).reshape(n, T, d)
    if t == "residual":
        y = x
        for sub in layer.layers:
            y = layer_forward(sub, y, ids)
        return x + y
    if t == "meanpool":
        return x.mean(axis=1)
    if t == "firsttoken":
        return x[:, 0]
    if t == "lasttoken":
        return x[np.arange(x.shape[0]), last_positions(ids)]
    raise ValueError(f"layer {layer.prefix}: unknown type {t!r}")


def logits(model, x):
    """The model's outputs for x [N, *input]: [N, classes], or [N, T,
    classes] for a next-token model."""
    x = _f64(x)
    if model.loss == "next_token":
        x = x[:, :-1]
    ids = x if model.first == "embedding" else None
    for layer in model.layers:
        x = layer_forward(layer, x, ids)
    return x
