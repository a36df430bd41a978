"""The model as a torch.nn.Module (needs PyTorch): the same layers and
semantics as engine.py, with the exported tensors as parameters.

The module takes x of shape [N, *input] (float; token ids as floats or
integers, -1 = padding) and returns what Predictor.logits returns.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from . import engine


class _Layer(nn.Module):
    """One layer; forward(x, ids) with ids the model's input ids or None."""

    def __init__(self, layer, dtype):
        super().__init__()
        self.kind = layer.type
        self.layer_spec = layer
        for name, value in layer.params.items():
            self.register_parameter(name, nn.Parameter(torch.tensor(value.copy(), dtype=dtype)))
        self.sub = nn.ModuleList([_Layer(s, dtype) for s in layer.layers])

    def forward(self, x, ids):
        ls, t = self.layer_spec, self.kind
        if t == "linear":
            return F.linear(x, self.weight, getattr(self, "bias", None))
        if t == "relu":
            return F.relu(x)
        if t == "tanh":
            return torch.tanh(x)
        if t == "gelu":
            return F.gelu(x)
        if t == "gelu_tanh":
            return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        if t == "flatten":
            return torch.flatten(x, 1)
        if t == "conv2d":
            return F.conv2d(x, self.weight, self.bias, stride=ls.stride, padding=ls.pad)
        if t == "maxpool":
            return F.max_pool2d(x, ls.kernel, ls.stride)
        if t == "avgpool":
            return F.avg_pool2d(x, ls.kernel, ls.stride)
        if t == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, ls.eps)
        if t == "embeddingbag":
            idx = x.long()
            valid = idx >= 0
            e = self.weight[idx.clamp(min=0)] * valid.unsqueeze(-1).to(self.weight.dtype)
            n = valid.sum(dim=1, keepdim=True).clamp(min=1).to(self.weight.dtype)
            return e.sum(dim=1) / n
        if t == "embedding":
            idx = x.long()
            T = idx.shape[1]
            valid = idx >= 0
            y = self.weight[idx.clamp(min=0)] * valid.unsqueeze(-1).to(self.weight.dtype)
            y = y + self.pos[ls.pos_offset : ls.pos_offset + T].unsqueeze(0)
            if ls.types > 0:
                sep = ls.type_sep if ls.type_sep is not None else -2
                types = torch.from_numpy(engine.token_types(idx.cpu().numpy(), ls.types, sep)).to(idx.device)
                y = y + self.types[types]
            return y
        if t == "attention":
            n, T, d3 = x.shape
            d = d3 // 3
            h = ls.heads
            dh = d // h
            q, k, v = (x[..., i * d : (i + 1) * d].reshape(n, T, h, dh).transpose(1, 2) for i in range(3))
            scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
            if ls.mask == "padding":
                allowed = (ids >= 0)[:, None, None, :].expand_as(scores)
            else:
                allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril().expand_as(scores)
            scores = scores.masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            probs = torch.where(allowed.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))
            return (probs @ v).transpose(1, 2).reshape(n, T, d)
        if t == "residual":
            y = x
            for sub in self.sub:
                y = sub(y, ids)
            return x + y
        if t == "meanpool":
            return x.mean(dim=1)
        if t == "firsttoken":
            return x[:, 0]
        if t == "lasttoken":
            last = torch.from_numpy(engine.last_positions(ids.cpu().numpy())).to(x.device)
            return x[torch.arange(x.shape[0], device=x.device), last]
        raise ValueError(f"layer {ls.prefix}: unknown type {t!r}")


class DPClusterModule(nn.Module):
    """A dpcluster model (spec.Model) as a torch module."""

    def __init__(self, model, dtype=torch.float32):
        super().__init__()
        self.next_token = model.loss == "next_token"
        self.embeds = model.first == "embedding"
        self.dtype = dtype
        self.layers = nn.ModuleList([_Layer(layer, dtype) for layer in model.layers])

    def forward(self, x):
        if self.next_token:
            x = x[:, :-1]
        ids = x.long() if self.embeds else None
        if self.layers[0].kind != "embeddingbag" and not self.embeds:
            x = x.to(self.dtype)
        for layer in self.layers:
            x = layer(x, ids)
        return x
