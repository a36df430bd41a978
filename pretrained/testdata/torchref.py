#!/usr/bin/python3
"""A PyTorch reference for the Go conformance tests of pretrained models:
small BertForSequenceClassification and GPT2ForSequenceClassification
written as plain torch.nn modules with Hugging Face transformers'
parameter names, layouts and arithmetic, run in float64.

Run it with Debian's /usr/bin/python3 and python3-torch (written against
torch 1.13); it needs nothing else outside the standard library: config.json
and safetensors files are read and written here.

    torchref.py init --arch bert|gpt2 --out DIR --seed N [sizes]
    torchref.py forward --dir DIR --ids IDS.json [--labels LABELS.json] --out OUT.safetensors
    torchref.py load-check --dir DIR --ids IDS.json --expect OUT.safetensors
    torchref.py selfcheck [--keep DIR]

Exit status: 0 on success; 1 when load-check finds the logits differ or
selfcheck fails; 2 for a usage error or an input this program refuses
(one line on stderr, "torchref: ...").

init
    Builds the model with random weights and writes DIR/config.json and
    DIR/model.safetensors, as save_pretrained lays them out.
      --arch bert|gpt2     BertForSequenceClassification or
                           GPT2ForSequenceClassification
      --out DIR            created if absent
      --seed N             torch.Generator seed; the weights are a function
                           of the seed, the sizes and the two std options
      --vocab V (60) --hidden H (16) --layers L (2) --heads A (2)
      --intermediate I (64; GPT-2: written as n_inner, null when I = 4H)
      --max-positions P (16) --type-vocab K (2, BERT) --labels C (2)
      --ln-eps E (BERT 1e-12, GPT-2 1e-5)
      --pad ID             pad_token_id (BERT 0; GPT-2 V-1, its
                           end-of-text token, the usual choice)
      --sep ID             BERT's sep_token_id (102 when V > 102, else V-1)
      --std S (0.02)       standard deviation of the Linear and Conv1D weights
                           and biases (the biases are not zero, so that a
                           wrong mapping shows)
      --embed-std S (--std) standard deviation of the embeddings
                           LayerNorm weights are 1 + 0.1·N(0,1) and biases
                           0.1·N(0,1), so that none is trivially 1 or 0.
                           The default is transformers' initializer_range,
                           under which the model is nearly linear: in one
                           draw, dropping the attention's 1/sqrt(head_dim)
                           moved BERT's logits by 9e-6 (relative), swapping
                           the LayerNorm epsilon (1e-12, 1e-5) by 1e-5, the
                           GELU form by 4e-9. For conformance tests use
                           --std 0.3 --embed-std 0.03 (as selfcheck does):
                           those became 0.7, 2e-3 and 4e-4 for BERT, 0.09,
                           4e-3 and 9e-5 for GPT-2. The two GELU forms
                           differ by at most 4.8e-4 (at |x| = 2.7): test
                           the form on its own, or compare tightly.
      --dtype F32|F16|BF16 (F32) the type stored; the values are drawn in
                           float32 and rounded to it (nearest even)
    config.json is json.dumps(indent=2, sort_keys=True) plus a newline, as
    PretrainedConfig.to_json_string writes it, with these keys:
      BERT:  architectures ["BertForSequenceClassification"], model_type
             "bert", vocab_size, hidden_size, num_hidden_layers,
             num_attention_heads, intermediate_size, max_position_embeddings,
             type_vocab_size, layer_norm_eps, hidden_act "gelu",
             pad_token_id, sep_token_id, position_embedding_type "absolute",
             id2label {"0": "LABEL_0", ...}, label2id, torch_dtype, and the
             dropout and initializer_range keys BertConfig writes.
      GPT-2: architectures ["GPT2ForSequenceClassification"], model_type
             "gpt2", vocab_size, n_embd, n_layer, n_head, n_inner (null or
             the value), n_positions, n_ctx, layer_norm_epsilon,
             activation_function "gelu_new", pad_token_id, bos_token_id and
             eos_token_id (V-1), scale_attn_weights true,
             scale_attn_by_inverse_layer_idx false,
             reorder_and_upcast_attn false, id2label, label2id,
             torch_dtype, and GPT2Config's dropout and summary keys.
    transformers_version is not written: transformers did not write it.

forward
    Loads DIR (config.json; model.safetensors in F32, F16, BF16 or F64),
    casts the model to float64 and runs the batch.
      --ids IDS.json       a JSON list of lists of token ids; -1 is padding,
                           on the right only; shorter rows are padded with -1
                           to the longest; at most max_position_embeddings
                           (n_positions) columns
      --labels LABELS.json a JSON list of class indices, one per row;
                           requires at least 2 labels (HF computes a
                           regression loss for num_labels 1)
      --out OUT.safetensors
      --out-dtype F32|F64 (F32) the type of every tensor written
      --sep ID             BERT only: overrides config.json's sep_token_id
    OUT.safetensors holds
      logits                    [B, C]
      loss                      [B]  each row's cross-entropy (labels only)
      grad.<i>.<name>           for each row i (0-based, in decimal: 0, 1,
                                ..., 10) and each parameter <name> (its HF
                                name, e.g. grad.0.bert.embeddings.word_
                                embeddings.weight, grad.2.transformer.h.0.
                                attn.c_attn.weight), the gradient of row i's
                                loss alone, in the parameter's stored layout
                                (Conv1D [in, out]) (labels only)
    The gradients are per-example autograd, one backward pass per row in
    float64.

load-check
    Loads DIR (a checkpoint exported by the Go side), runs IDS.json as
    forward does and compares its logits with OUT.safetensors' "logits":
    max|got - want| / max(max|want|, 1e-6) <= --tol (1e-4). Prints one line
    ("ok ..." on stdout, or the largest difference on stderr, exit 1).
    Tensor names may carry or lack the base prefix ("bert.", "transformer."),
    as from_pretrained accepts; the buffers older checkpoints hold
    (position_ids, token_type_ids, attn.bias, attn.masked_bias) are ignored;
    any other tensor the model does not have is an error.

selfcheck
    Checks this program on tiny models in a temporary folder, removed on
    success (--keep DIR writes into DIR and keeps it): the safetensors
    writer and reader round-trip F64, F32, F16, BF16 and I64 bit for bit;
    logits, losses and gradients do not change when padding is appended or
    a row runs alone; the gradients written equal central finite
    differences of the loss in float64; load-check passes on the initial
    checkpoint and fails on a perturbed one; init --dtype F16 and BF16
    store the F32 weights rounded; malformed inputs exit 2. About 2 s.

Inputs (the project's convention; rows right-padded with -1):
    input_ids      = ids with -1 replaced by pad_token_id (0 when null)
    attention_mask = ids != -1
    BERT token_type_ids[t] = the number of sep_token_id ids strictly before
                     position t, capped at type_vocab_size - 1 ([CLS] A
                     [SEP] B [SEP] gives 0 for [CLS], A and the first [SEP],
                     1 for B and the second)
    GPT-2 pooled token = the last position whose id is not -1 (position 0
                     when the row is all padding). transformers takes the
                     position before the first pad_token_id id, which is
                     the same for right-padded rows that hold no
                     pad_token_id of their own.
    position_ids   = 0, 1, ..., T-1 for every row (HF's default).

Semantics kept from transformers that a port must match:
    - BERT's word embedding is nn.Embedding(padding_idx=pad_token_id): the
      gradient of row pad_token_id is always zero, even where a real token
      has that id.
    - The padding mask adds (1 - mask)·finfo(dtype).min to the scaled scores
      (modeling_utils.get_extended_attention_mask); GPT-2 first replaces the
      scores above the diagonal with finfo(dtype).min, then adds the mask.
    - Eval mode: no dropout.
    - Some gradients are zero but for rounding: the attention key bias's
      (BERT's key.bias, the middle third of GPT-2's c_attn.bias), as
      softmax ignores a shift shared by a query's scores. Compare gradients
      with a tolerance relative to a scale, not tensor by tensor.

Where the arithmetic and the names come from (huggingface/transformers):
    src/transformers/models/bert/modeling_bert.py at commit
        8ec58104181bfb34d824d89bccc009b4f6be6e0e: BertEmbeddings (sum of
        word, token-type and position embeddings, then LayerNorm),
        BertSelfAttention (separate query, key, value Linear layers; scores
        divided by sqrt(head_dim), mask added, softmax), BertSelfOutput and
        BertOutput (dense, then LayerNorm of the sum with the block's input:
        post-LN), BertIntermediate (dense, hidden_act), BertPooler (tanh of
        dense of the first token), BertForSequenceClassification
        (classifier Linear on the pooled output).
    src/transformers/models/gpt2/modeling_gpt2.py at commit
        c44b2d9976e8eafbdcb89cb2710141b2bc9b138f: GPT2Attention._attn (c_attn
        split into query, key, value in that order; scores divided by
        value.size(-1) ** 0.5; causal torch.where, then the mask), GPT2MLP,
        GPT2Block (pre-LN: x + attn(ln_1(x)), then x + mlp(ln_2(x))),
        GPT2Model (wte + wpe, blocks, ln_f), GPT2ForSequenceClassification
        (score Linear without bias, at the last non-padding token).
    src/transformers/pytorch_utils.py at commit
        3009a8a4b92d0d63b18d11575a413a4b78a55776: Conv1D, weight
        torch.empty(nx, nf), y = addmm(bias, x, weight) = x·W + b.
    src/transformers/activations.py at commit
        d60525f3595f8214576d6b8f1c54ac7cd0b5c42c: "gelu" is the erf form
        (F.gelu), "gelu_new" the tanh form
        0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))).
    The safetensors layout is make_fixtures.py's (checkpoint/testdata): an
    8-byte little-endian header length, compact JSON with "__metadata__"
    {"format": "pt"} first and the tensors in data order, padded with spaces
    to a multiple of 8 bytes, tensors sorted by dtype (largest alignment
    first) then name, stored back to back.
"""

import argparse
import contextlib
import io
import json
import math
import os
import random
import shutil
import struct
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn


class InputError(Exception):
    """An input this program refuses: exit status 2, one line."""


# ---------------------------------------------------------------- safetensors

# The order of safetensors' Rust enum Dtype; its writer sorts by it,
# descending, then by name.
DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
               "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
               "C64", "F64", "I64", "U64"]

# The types this program converts: torch type, and the signed integer type
# of the same width (with its struct code) that carries the bits.
DTYPES = {
    "F64": (torch.float64, torch.int64, "q"),
    "F32": (torch.float32, torch.int32, "i"),
    "F16": (torch.float16, torch.int16, "h"),
    "BF16": (torch.bfloat16, torch.int16, "h"),
    "I64": (torch.int64, torch.int64, "q"),
}

# Element sizes of the format's whole-byte types, to check a header.
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
               "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
               "C64": 8, "F64": 8, "I64": 8, "U64": 8}


def encode(t, dtype):
    """The little-endian bytes of tensor t converted to dtype (rounded to
    nearest even by torch), taken bit for bit through an integer view."""
    tdtype, itype, code = DTYPES[dtype]
    flat = t.detach().cpu().to(tdtype).contiguous().reshape(-1)
    bits = flat.view(itype).tolist()
    return struct.pack("<%d%s" % (len(bits), code), *bits)


def decode(b, dtype, shape):
    tdtype, itype, code = DTYPES[dtype]
    n = len(b) // struct.calcsize("<" + code)
    bits = torch.tensor(struct.unpack("<%d%s" % (n, code), b), dtype=itype)
    return bits.view(tdtype).reshape(shape)


def write_safetensors(path, tensors, metadata=None):
    """Writes tensors, a list of (name, dtype, tensor), to path through a
    temporary file in the same folder and a rename, so that a reader never
    sees half a file."""
    order = sorted(tensors, key=lambda e: (-DTYPE_ORDER.index(e[1]), e[0]))
    header = {"__metadata__": metadata if metadata is not None else {"format": "pt"}}
    blobs, offset = [], 0
    for name, dtype, t in order:
        if name in header:
            raise ValueError("tensor %r twice" % name)
        b = encode(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), ".%s.tmp" % os.path.basename(path))
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for b in blobs:
                f.write(b)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_safetensors(path):
    """Reads path and returns ({name: tensor or None}, metadata); a tensor
    of a type this program does not convert (U8, BOOL, ...) is None. The
    header is checked as the format requires: sizes that match the shapes,
    byte ranges inside the data that neither overlap nor leave a gap."""
    with open(path, "rb") as f:
        data = f.read()
    bad = lambda msg: InputError("%s: not a safetensors file: %s" % (path, msg))
    if len(data) < 8:
        raise bad("%d bytes" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise bad("header length %d runs past the end" % n)
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except ValueError as e:
        raise bad("header: %s" % e)
    if not isinstance(header, dict):
        raise bad("header is not an object")
    meta = header.pop("__metadata__", None)
    body = data[8 + n:]
    ranges = []
    for name, e in header.items():
        try:
            dtype, shape, (begin, end) = e["dtype"], [int(d) for d in e["shape"]], e["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise bad("tensor %r: entry %r" % (name, e))
        if dtype not in DTYPE_SIZES or any(d < 0 for d in shape):
            raise bad("tensor %r: dtype %r shape %r" % (name, dtype, shape))
        if not 0 <= begin <= end or end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
            raise bad("tensor %r: %s %r does not fill data_offsets %r" % (name, dtype, shape, [begin, end]))
        ranges.append((begin, end, name, dtype, shape))
    at = 0
    for begin, end, name, _, _ in sorted(ranges):
        if begin != at:
            raise bad("tensor %r starts at byte %d of the data, want %d (a gap or an overlap)" % (name, begin, at))
        at = end
    if at != len(body):
        raise bad("the tensors cover %d bytes of the %d after the header" % (at, len(body)))
    out = {name: decode(body[begin:end], dtype, shape) if dtype in DTYPES else None
           for begin, end, name, dtype, shape in ranges}
    return out, meta


# --------------------------------------------------------------------- config

class Config:
    """A model's sizes, read from or written to config.json."""

    def __init__(self, arch, vocab, hidden, layers, heads, intermediate, positions, type_vocab, eps,
                 act, pad, sep, labels):
        self.arch, self.vocab, self.hidden, self.layers, self.heads = arch, vocab, hidden, layers, heads
        self.intermediate, self.positions, self.type_vocab, self.eps = intermediate, positions, type_vocab, eps
        self.act, self.pad, self.sep, self.labels = act, pad, sep, labels

    def validate(self):
        sizes = {"vocab": self.vocab, "hidden": self.hidden, "layers": self.layers, "heads": self.heads,
                 "intermediate": self.intermediate, "max positions": self.positions, "labels": self.labels}
        if self.arch == "bert":
            sizes["type vocab"] = self.type_vocab
        for k, v in sizes.items():
            if not isinstance(v, int) or v < 1:
                raise InputError("%s is %r, not a positive integer" % (k, v))
        if self.hidden % self.heads:
            raise InputError("hidden size %d is not divisible by %d heads" % (self.hidden, self.heads))
        if not self.eps > 0:
            raise InputError("layer-norm epsilon %r is not positive" % self.eps)
        if self.act not in ACTIVATIONS:
            raise InputError("activation %r is not one of %s" % (self.act, ", ".join(sorted(ACTIVATIONS))))
        if self.pad is not None and not 0 <= self.pad < self.vocab:
            raise InputError("pad_token_id %d is outside the vocabulary of %d" % (self.pad, self.vocab))


def labels_json(n):
    id2label = {str(i): "LABEL_%d" % i for i in range(n)}
    return id2label, {v: int(k) for k, v in id2label.items()}


def config_json(c, dtype):
    """config.json's object for c, with the keys BertConfig or GPT2Config's
    save_pretrained writes for such a model."""
    id2label, label2id = labels_json(c.labels)
    torch_dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
    if c.arch == "bert":
        return {"architectures": ["BertForSequenceClassification"], "attention_probs_dropout_prob": 0.1,
                "classifier_dropout": None, "hidden_act": c.act, "hidden_dropout_prob": 0.1,
                "hidden_size": c.hidden, "id2label": id2label, "initializer_range": 0.02,
                "intermediate_size": c.intermediate, "label2id": label2id, "layer_norm_eps": c.eps,
                "max_position_embeddings": c.positions, "model_type": "bert",
                "num_attention_heads": c.heads, "num_hidden_layers": c.layers, "pad_token_id": c.pad,
                "position_embedding_type": "absolute", "sep_token_id": c.sep, "torch_dtype": torch_dtype,
                "type_vocab_size": c.type_vocab, "use_cache": True, "vocab_size": c.vocab}
    return {"activation_function": c.act, "architectures": ["GPT2ForSequenceClassification"],
            "attn_pdrop": 0.1, "bos_token_id": c.vocab - 1, "embd_pdrop": 0.1, "eos_token_id": c.vocab - 1,
            "id2label": id2label, "initializer_range": 0.02, "label2id": label2id,
            "layer_norm_epsilon": c.eps, "model_type": "gpt2", "n_ctx": c.positions, "n_embd": c.hidden,
            "n_head": c.heads, "n_inner": None if c.intermediate == 4 * c.hidden else c.intermediate,
            "n_layer": c.layers, "n_positions": c.positions, "pad_token_id": c.pad,
            "reorder_and_upcast_attn": False, "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False,
            "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
            "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
            "torch_dtype": torch_dtype, "use_cache": True, "vocab_size": c.vocab}


def read_config(folder, sep=None):
    """Reads folder/config.json with BertConfig's and GPT2Config's defaults
    for the keys it omits; sep, when given, overrides sep_token_id."""
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            k = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError("%s: %s" % (path, e))
    archs = k.get("architectures") or []
    arch = k.get("model_type") or ("gpt2" if any(a.startswith("GPT2") for a in archs) else "bert")
    if arch not in ("bert", "gpt2"):
        raise InputError("%s: model_type %r is neither bert nor gpt2" % (path, arch))

    def get(default, *names):
        for n in names:
            if k.get(n) is not None:
                return k[n]
        return default

    # No pad token is null in transformers' configs, -1 in config.go's.
    pad = lambda v: None if v is None or (isinstance(v, int) and v < 0) else v
    if k.get("add_cross_attention"):
        raise InputError("%s: add_cross_attention is not supported" % path)
    if "id2label" in k and k["id2label"] is not None:
        labels = len(k["id2label"])
    else:
        labels = get(2, "num_labels")
    if arch == "bert":
        if get("absolute", "position_embedding_type") != "absolute":
            raise InputError("%s: only absolute position embeddings are supported" % path)
        hidden = get(768, "hidden_size")
        c = Config("bert", get(30522, "vocab_size"), hidden, get(12, "num_hidden_layers"),
                   get(12, "num_attention_heads"), get(3072, "intermediate_size"),
                   get(512, "max_position_embeddings"), get(2, "type_vocab_size"), get(1e-12, "layer_norm_eps"),
                   get("gelu", "hidden_act"), pad(k.get("pad_token_id", 0)), get(102, "sep_token_id"), labels)
    else:
        if get(False, "scale_attn_by_inverse_layer_idx") or not get(True, "scale_attn_weights"):
            raise InputError("%s: only scale_attn_weights true and scale_attn_by_inverse_layer_idx false "
                             "are supported" % path)
        hidden = get(768, "n_embd", "hidden_size")
        c = Config("gpt2", get(50257, "vocab_size"), hidden, get(12, "n_layer", "num_hidden_layers"),
                   get(12, "n_head", "num_attention_heads"), get(4 * hidden, "n_inner"),
                   get(1024, "n_positions", "max_position_embeddings"), 0,
                   get(1e-5, "layer_norm_epsilon"), get("gelu_new", "activation_function"),
                   pad(k.get("pad_token_id")), None, labels)
    if sep is not None:
        c.sep = sep
    try:
        c.validate()
    except InputError as e:
        raise InputError("%s: %s" % (path, e))
    return c


# --------------------------------------------------------------------- models

def gelu_tanh(x):
    """transformers' "gelu_new" (NewGELUActivation): the tanh form."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


# transformers' ACT2FN entries for the activations config.go accepts;
# "gelu" is the erf form x·Φ(x).
ACTIVATIONS = {"gelu": F.gelu, "gelu_new": gelu_tanh, "relu": F.relu, "silu": F.silu, "tanh": torch.tanh}


def padding_mask(attention_mask, dtype):
    """[B, T] of 0/1 to the additive [B, 1, 1, T]: 0 where attended,
    finfo(dtype).min where masked."""
    m = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - m) * torch.finfo(dtype).min


def split_heads(x, heads):
    b, t, d = x.shape
    return x.view(b, t, heads, d // heads).transpose(1, 2)  # [B, heads, T, head_dim]


def merge_heads(x):
    b, h, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, h * hd)


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab, c.hidden, padding_idx=c.pad)
        self.position_embeddings = nn.Embedding(c.positions, c.hidden)
        self.token_type_embeddings = nn.Embedding(c.type_vocab, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, input_ids, token_type_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.query = nn.Linear(c.hidden, c.hidden)
        self.key = nn.Linear(c.hidden, c.hidden)
        self.value = nn.Linear(c.hidden, c.hidden)

    def forward(self, x, mask):
        q = split_heads(self.query(x), self.heads)
        k = split_heads(self.key(x), self.heads)
        v = split_heads(self.value(x), self.heads)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return merge_heads(torch.softmax(scores + mask, dim=-1) @ v)


class BertSelfOutput(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, h, residual):
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        # transformers names the attention proper "self": the state_dict
        # keys are attention.self.query.weight and so on.
        setattr(self, "self", BertSelfAttention(c))
        self.output = BertSelfOutput(c)

    def forward(self, x, mask):
        return self.output(getattr(self, "self")(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden, c.intermediate)
        self.act = ACTIVATIONS[c.act]

    def forward(self, x):
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.intermediate, c.hidden)
        self.LayerNorm = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, h, residual):
        return self.LayerNorm(self.dense(h) + residual)


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertOutput(c)

    def forward(self, x, mask):
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c.layers)])

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertPooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden, c.hidden)

    def forward(self, h):
        return torch.tanh(self.dense(h[:, 0]))


class BertModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.pooler = BertPooler(c)

    def forward(self, input_ids, attention_mask, token_type_ids):
        x = self.embeddings(input_ids, token_type_ids)
        x = self.encoder(x, padding_mask(attention_mask, x.dtype))
        return self.pooler(x)


class BertForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.classifier = nn.Linear(c.hidden, c.labels)

    def forward(self, inputs):
        return self.classifier(self.bert(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]))


class Conv1D(nn.Module):
    """GPT-2's projection: weight [n_in, n_out], the transpose of a
    Linear's, and y = x·W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.c_attn = Conv1D(c.hidden, 3 * c.hidden)
        self.c_proj = Conv1D(c.hidden, c.hidden)

    def forward(self, x, mask):
        q, k, v = (split_heads(y, self.heads) for y in self.c_attn(x).split(x.shape[-1], dim=2))
        scores = q @ k.transpose(-1, -2) / (v.shape[-1] ** 0.5)
        t = x.shape[1]
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        lowest = torch.full([], torch.finfo(scores.dtype).min, dtype=scores.dtype, device=x.device)
        scores = torch.where(causal, scores, lowest) + mask
        return self.c_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


class GPT2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(c.hidden, c.intermediate)
        self.c_proj = Conv1D(c.intermediate, c.hidden)
        self.act = ACTIVATIONS[c.act]

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.mlp = GPT2MLP(c)

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.hidden)
        self.wpe = nn.Embedding(c.positions, c.hidden)
        self.h = nn.ModuleList([GPT2Block(c) for _ in range(c.layers)])
        self.ln_f = nn.LayerNorm(c.hidden, eps=c.eps)

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        x = self.wte(input_ids) + self.wpe(positions)
        mask = padding_mask(attention_mask, x.dtype)
        for block in self.h:
            x = block(x, mask)
        return self.ln_f(x)


class GPT2ForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)
        self.score = nn.Linear(c.hidden, c.labels, bias=False)

    def forward(self, inputs):
        h = self.transformer(inputs["input_ids"], inputs["attention_mask"])
        rows = torch.arange(h.shape[0], device=h.device)
        return self.score(h[rows, inputs["last"]])


def build(c):
    model = BertForSequenceClassification(c) if c.arch == "bert" else GPT2ForSequenceClassification(c)
    return model.eval()


# Buffers that checkpoints saved by some versions of transformers hold and
# that carry nothing a forward pass needs.
BUFFER_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids", "attn.bias", "attn.masked_bias")


def load(folder, sep=None):
    """The model in folder, as float64, and its Config."""
    c = read_config(folder, sep)
    model = build(c)
    path = os.path.join(folder, "model.safetensors")
    try:
        tensors, _ = read_safetensors(path)
    except OSError as e:
        raise InputError(str(e))
    prefix = "bert." if c.arch == "bert" else "transformer."
    state = {}
    for name, p in model.state_dict().items():
        t = tensors.pop(name, None)
        if t is None and name.startswith(prefix):
            t = tensors.pop(name[len(prefix):], None)  # a bare base model's name
        if t is None:
            raise InputError("%s: no tensor %s (%s) of a type this program reads" % (path, name, list(p.shape)))
        if list(t.shape) != list(p.shape):
            raise InputError("%s: %s has shape %s, want %s" % (path, name, list(t.shape), list(p.shape)))
        if not t.is_floating_point():
            raise InputError("%s: %s is %s, not a float" % (path, name, t.dtype))
        state[name] = t.to(torch.float64)
    extra = sorted(n for n in tensors if not n.endswith(BUFFER_SUFFIXES))
    if extra:
        raise InputError("%s: tensors the model does not have: %s" % (path, ", ".join(extra[:5])))
    model = model.double()
    model.load_state_dict(state)
    return model, c


# --------------------------------------------------------------------- inputs

def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise InputError("%s: %s" % (path, e))


def ids_tensor(rows, c):
    """The -1-padded [B, T] LongTensor of rows (a list of lists of ints),
    each right-padded with -1 to the longest; checked against c."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise InputError("ids: want a non-empty JSON list of lists of token ids")
    width = max(len(r) for r in rows)
    if width > c.positions:
        raise InputError("ids: %d columns, more than the %d positions" % (width, c.positions))
    if width == 0:
        raise InputError("ids: every row is empty")
    for i, r in enumerate(rows):
        for t, v in enumerate(r):
            if not isinstance(v, int) or isinstance(v, bool) or not -1 <= v < c.vocab:
                raise InputError("ids: row %d position %d is %r, not -1 or an id below %d" % (i, t, v, c.vocab))
            if v != -1 and t > 0 and r[t - 1] == -1:
                raise InputError("ids: row %d has token %d after padding (rows are right-padded)" % (i, v))
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long)


def model_inputs(ids, c):
    """The model's inputs for the -1-padded ids (see the module doc)."""
    real = ids != -1
    pad = c.pad if c.pad is not None else 0
    inputs = {"input_ids": torch.where(real, ids, torch.full_like(ids, pad)), "attention_mask": real.long()}
    if c.arch == "bert":
        sep = (ids == c.sep).long()
        inputs["token_type_ids"] = (torch.cumsum(sep, dim=1) - sep).clamp(max=c.type_vocab - 1)
    else:
        t = torch.arange(ids.shape[1])[None, :].expand_as(ids)
        inputs["last"] = torch.where(real, t, torch.zeros_like(t)).max(dim=1).values
    return inputs


def labels_tensor(labels, batch, c):
    if c.labels < 2:
        raise InputError("labels: the model has %d label; the loss is cross-entropy over 2 or more" % c.labels)
    if not isinstance(labels, list) or len(labels) != batch:
        raise InputError("labels: want a JSON list of %d class indices" % batch)
    for i, v in enumerate(labels):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < c.labels:
            raise InputError("labels: entry %d is %r, not a class below %d" % (i, v, c.labels))
    return torch.tensor(labels, dtype=torch.long)


def logits_of(model, ids, c):
    with torch.no_grad():
        return model(model_inputs(ids, c))


def per_example(model, ids, labels, c):
    """Each row's cross-entropy loss and its gradient with respect to every
    parameter, one backward pass per row: [(loss, {name: grad})]."""
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    out = []
    for i in range(ids.shape[0]):
        logits = model(model_inputs(ids[i:i + 1], c))
        loss = F.cross_entropy(logits, labels[i:i + 1])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        out.append((loss.detach(), {n: (torch.zeros_like(p) if g is None else g)
                                    for n, p, g in zip(names, params, grads)}))
    return out


# ------------------------------------------------------------------- commands

def init_weights(model, seed, std, embed_std):
    """Fills every parameter, in state_dict order, from a generator seeded
    with seed: N(0, embed_std²) for the embeddings; 1 + N(0, 0.1²) and
    N(0, 0.1²) for LayerNorm weights and biases; N(0, std²) for the rest,
    weights and biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if ".LayerNorm." in name or ".ln_" in name:
                p.copy_((1.0 if name.endswith(".weight") else 0.0) + 0.1 * noise)
            elif isinstance(model.get_submodule(name.rsplit(".", 1)[0]), nn.Embedding):
                p.copy_(embed_std * noise)
            else:
                p.copy_(std * noise)


def cmd_init(a):
    defaults = {"bert": (1e-12, "gelu", 0), "gpt2": (1e-5, "gelu_new", a.vocab - 1)}
    eps, act, pad = defaults[a.arch]
    sep = a.sep if a.sep is not None else (102 if a.vocab > 102 else a.vocab - 1)
    c = Config(a.arch, a.vocab, a.hidden, a.layers, a.heads, a.intermediate or 4 * a.hidden, a.max_positions,
               a.type_vocab if a.arch == "bert" else 0, a.ln_eps if a.ln_eps is not None else eps, act,
               a.pad if a.pad is not None else pad, sep if a.arch == "bert" else None, a.labels)
    c.validate()
    if c.arch == "bert" and not 0 <= c.sep < c.vocab:
        raise InputError("sep_token_id %d is outside the vocabulary of %d" % (c.sep, c.vocab))
    model = build(c)
    init_weights(model, a.seed, a.std, a.embed_std if a.embed_std is not None else a.std)
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"),
                      [(n, a.dtype, t) for n, t in model.state_dict().items()])
    with open(os.path.join(a.out, "config.json"), "w") as f:
        f.write(json.dumps(config_json(c, a.dtype), indent=2, sort_keys=True) + "\n")
    print("init: %s %s, %d parameters, %s" % (a.arch, a.out, sum(p.numel() for p in model.parameters()), a.dtype))
    return 0


def cmd_forward(a):
    model, c = load(a.dir, a.sep)
    ids = ids_tensor(read_json(a.ids), c)
    out = [("logits", a.out_dtype, logits_of(model, ids, c))]
    if a.labels:
        labels = labels_tensor(read_json(a.labels), ids.shape[0], c)
        rows = per_example(model, ids, labels, c)
        out.append(("loss", a.out_dtype, torch.stack([loss for loss, _ in rows])))
        for i, (_, grads) in enumerate(rows):
            out += [("grad.%d.%s" % (i, n), a.out_dtype, g) for n, g in grads.items()]
    write_safetensors(a.out, out)
    print("forward: %s, %d rows of %d columns%s" % (a.out, ids.shape[0], ids.shape[1],
                                                     ", per-example gradients" if a.labels else ""))
    return 0


def compare(got, want):
    """(relative error, description of the largest difference)."""
    diff = (got - want).abs()
    i = int(diff.reshape(-1).argmax())
    row, col = divmod(i, want.shape[-1]) if want.dim() == 2 else (i, 0)
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1e-6)
    rel = float(diff.reshape(-1)[i]) / scale
    where = "row %d label %d: got %.9g, want %.9g" % (row, col, float(got.reshape(-1)[i]), float(want.reshape(-1)[i]))
    return rel, "max |got-want| = %.3g at %s (relative %.3g)" % (float(diff.reshape(-1)[i]), where, rel)


def cmd_load_check(a):
    model, c = load(a.dir, a.sep)
    ids = ids_tensor(read_json(a.ids), c)
    expect, _ = read_safetensors(a.expect)
    want = expect.get("logits")
    if want is None:
        raise InputError("%s: no float tensor logits" % a.expect)
    got = logits_of(model, ids, c)
    if list(want.shape) != list(got.shape):
        raise InputError("%s: logits has shape %s, the model gives %s" % (a.expect, list(want.shape),
                                                                         list(got.shape)))
    rel, msg = compare(got, want.to(torch.float64))
    if not rel <= a.tol:
        print("torchref: load-check: %s: logits differ: %s > %g" % (a.dir, msg, a.tol), file=sys.stderr)
        return 1
    print("ok load-check: %s: %s" % (a.dir, msg))
    return 0


# ------------------------------------------------------------------ selfcheck

def check(ok, msg):
    if not ok:
        raise AssertionError(msg)


def selfcheck_safetensors(tmp):
    g = torch.Generator().manual_seed(1)
    ts = [("a", "F32", torch.randn(3, 5, generator=g)), ("b", "F16", torch.randn(7, generator=g)),
          ("c", "BF16", torch.randn(2, 3, generator=g) * 1e3), ("d", "F64", torch.randn(4, 1, generator=g)),
          ("e", "I64", torch.arange(6).reshape(2, 3)), ("scalar", "F32", torch.tensor(-2.5)),
          ("empty", "F32", torch.zeros(0, 3)),
          ("special", "F32", torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1e-45]))]
    path = os.path.join(tmp, "roundtrip.safetensors")
    write_safetensors(path, ts)
    back, meta = read_safetensors(path)
    check(meta == {"format": "pt"}, "metadata %r" % meta)
    check(sorted(back) == sorted(n for n, _, _ in ts), "names %r" % sorted(back))
    for name, dtype, t in ts:
        want = t.to(DTYPES[dtype][0])
        got = back[name]
        check(got.dtype == want.dtype and list(got.shape) == list(want.shape), "%s: %s %s" % (name, got.dtype,
                                                                                         list(got.shape)))
        check(torch.equal(got.reshape(-1).view(DTYPES[dtype][1]), want.reshape(-1).view(DTYPES[dtype][1])),
              "%s: the bits differ" % name)
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    check(n % 8 == 0, "header length %d is not a multiple of 8" % n)
    check(raw[8:8 + n].startswith(b'{"__metadata__"'), "metadata is not first")
    with open(path, "wb") as f:
        f.write(raw[:-1])
    try:
        read_safetensors(path)
        check(False, "a truncated file was read")
    except InputError:
        pass
    print("selfcheck: safetensors: %d tensors of F64, F32, F16, BF16 and I64 round-trip bit for bit; "
          "a truncated file is refused" % len(ts))


def call(argv):
    """Runs main(argv) with its output captured: (exit status, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue().strip()


def run(argv):
    code, err = call(argv)
    check(code == 0, "torchref %s: exit %d: %s" % (" ".join(argv), code, err))


def write_json(path, v):
    with open(path, "w") as f:
        json.dump(v, f)


def selfcheck_padding(arch, d, rows, labels, width):
    """Logits and gradients of each row are the same in the batch, with the
    batch padded to width columns, and for the row alone, unpadded."""
    base = os.path.join(d, "batch")
    write_json(base + ".ids.json", rows)
    write_json(base + ".labels.json", labels)
    run(["forward", "--dir", d, "--ids", base + ".ids.json", "--labels", base + ".labels.json",
         "--out", base + ".safetensors", "--out-dtype", "F64"])
    ref, _ = read_safetensors(base + ".safetensors")
    variants = [("padded to %d" % width, [r + [-1] * (width - len(r)) for r in rows], list(range(len(rows))))]
    variants += [("row %d alone" % i, [[v for v in rows[i] if v != -1]], [i]) for i in range(len(rows))]
    worst = 0.0
    for what, vrows, index in variants:
        p = os.path.join(d, "variant")
        write_json(p + ".ids.json", vrows)
        write_json(p + ".labels.json", [labels[i] for i in index])
        run(["forward", "--dir", d, "--ids", p + ".ids.json", "--labels", p + ".labels.json",
             "--out", p + ".safetensors", "--out-dtype", "F64"])
        got, _ = read_safetensors(p + ".safetensors")
        for j, i in enumerate(index):
            pairs = [(got["logits"][j], ref["logits"][i]), (got["loss"][j], ref["loss"][i])]
            grads = [(got[n], ref[n.replace("grad.%d." % j, "grad.%d." % i, 1)])
                     for n in got if n.startswith("grad.%d." % j)]
            # Gradients are compared on the scale of the row's largest: some
            # are zero but for rounding (the key bias's, as softmax ignores
            # a shift shared by a query's scores).
            scale = max(float(y.abs().max()) for _, y in grads)
            scaled = [(x, y, float(y.abs().max())) for x, y in pairs] + [(x, y, scale) for x, y in grads]
            for x, y, s in scaled:
                err = float((x - y).abs().max()) / max(s, 1e-12)
                worst = max(worst, err)
                check(err < 1e-10, "%s: %s: row %d differs from the batch's by %.3g (relative)" % (arch, what, i, err))
    print("selfcheck: %s: padding: logits, losses and gradients of %d rows equal padded to %d and alone "
          "(largest difference %.2g, relative)" % (arch, len(rows), width, worst))
    return ref


def selfcheck_gradients(arch, d, rows, labels, ref, rng):
    """The gradients written equal central finite differences of the loss,
    in float64, at one coordinate of every parameter for each row: for an
    embedding, a random row the input uses."""
    model, c = load(d)
    ids = ids_tensor(rows, c)
    inputs = model_inputs(ids, c)
    params = dict(model.named_parameters())
    h, worst, nonzero, count = 1e-6, 0.0, 0, 0
    for i in range(len(rows)):
        used = {"word_embeddings": inputs["input_ids"][i], "wte": inputs["input_ids"][i],
                "position_embeddings": torch.arange(int(inputs["attention_mask"][i].sum())),
                "wpe": torch.arange(int(inputs["attention_mask"][i].sum()))}
        if arch == "bert":
            used["token_type_embeddings"] = inputs["token_type_ids"][i]
        for name, p in params.items():
            kind = name.split(".")[-2]
            coord = [rng.randrange(s) for s in p.shape]
            if kind in used and len(used[kind]):
                coord[0] = int(used[kind][rng.randrange(len(used[kind]))])
            coord = tuple(coord)

            def loss_at(v):
                with torch.no_grad():
                    old = float(p[coord])
                    p[coord] = v
                    logits = model(model_inputs(ids[i:i + 1], c))
                    p[coord] = old
                return float(F.cross_entropy(logits, torch.tensor([labels[i]])))

            x = float(p[coord])
            fd = (loss_at(x + h) - loss_at(x - h)) / (2 * h)
            g = float(ref["grad.%d.%s" % (i, name)][coord])
            err = abs(fd - g)
            worst = max(worst, err / max(abs(g), 1e-3))
            check(err <= 1e-7 + 1e-6 * abs(g), "%s: row %d %s%s: gradient %.12g, finite difference %.12g"
                  % (arch, i, name, list(coord), g, fd))
            nonzero += abs(g) > 1e-8
            count += 1
    check(nonzero > count // 2, "%s: only %d of %d gradients checked are non-zero" % (arch, nonzero, count))
    print("selfcheck: %s: gradients: %d coordinates (%d non-zero) equal central differences "
          "(largest error %.2g relative to max(|g|, 1e-3))" % (arch, count, nonzero, worst))


def selfcheck_load_check(arch, d, tmp):
    """load-check passes on the checkpoint forward read and fails, exit 1,
    on a copy with one tensor perturbed (and the base prefix left out of
    the names, which it must accept)."""
    ids = os.path.join(d, "batch.ids.json")
    expect = os.path.join(d, "batch.safetensors")
    run(["load-check", "--dir", d, "--ids", ids, "--expect", expect])
    bad = os.path.join(tmp, arch + "-perturbed")
    os.makedirs(bad, exist_ok=True)
    with open(os.path.join(d, "config.json")) as f, open(os.path.join(bad, "config.json"), "w") as g:
        g.write(f.read())
    tensors, _ = read_safetensors(os.path.join(d, "model.safetensors"))
    name = "classifier.bias" if arch == "bert" else "transformer.ln_f.bias"
    tensors[name] = tensors[name] + 1e-2
    # a bare base model's names: load-check must accept them.
    prefix = "bert." if arch == "bert" else "transformer."
    write_safetensors(os.path.join(bad, "model.safetensors"),
                      [(n[len(prefix):] if n.startswith(prefix) else n, "F32", t) for n, t in tensors.items()])
    code, err = call(["load-check", "--dir", bad, "--ids", ids, "--expect", expect])
    check(code == 1 and "logits differ" in err, "%s: load-check on a perturbed %s exited %d (%s), want 1"
          % (arch, name, code, err))
    print("selfcheck: %s: load-check passes on the checkpoint and fails on one with %s moved by 1e-2"
          % (arch, name))


def selfcheck_dtypes(arch, d, tmp, init):
    """init --dtype F16 and BF16 store the F32 weights rounded."""
    f32, _ = read_safetensors(os.path.join(d, "model.safetensors"))
    for dtype in ("F16", "BF16"):
        o = os.path.join(tmp, "%s-%s" % (arch, dtype))
        run(["init", "--arch", arch, "--out", o, "--dtype", dtype] + init)
        got, _ = read_safetensors(os.path.join(o, "model.safetensors"))
        for n, t in f32.items():
            check(torch.equal(got[n], t.to(DTYPES[dtype][0])), "%s: %s %s is not the F32 value rounded"
                  % (arch, dtype, n))
        load(o)
    print("selfcheck: %s: init --dtype F16 and BF16 store the F32 weights rounded; both load" % arch)


def selfcheck_refusals(d, tmp):
    """Inputs outside the contract exit 2 with one line naming the fault."""
    cases = [("token after padding", [[1, 2, -1, 3]], "after padding"),
             ("id outside the vocabulary", [[1, 60]], "not -1 or an id below 60"),
             ("more columns than positions", [[1] * 17], "more than the 16 positions"),
             ("not a list of lists", [1, 2], "list of lists")]
    for what, rows, want in cases:
        p = os.path.join(tmp, "refused.ids.json")
        write_json(p, rows)
        code, err = call(["forward", "--dir", d, "--ids", p, "--out", os.path.join(tmp, "refused.safetensors")])
        check(code == 2 and want in err and "\n" not in err, "%s: exit %d, %r" % (what, code, err))
    write_json(os.path.join(tmp, "ok.ids.json"), [[1, 2]])
    write_json(os.path.join(tmp, "bad.labels.json"), [3])
    code, err = call(["forward", "--dir", d, "--ids", os.path.join(tmp, "ok.ids.json"), "--labels",
                      os.path.join(tmp, "bad.labels.json"), "--out", os.path.join(tmp, "refused.safetensors")])
    check(code == 2 and "not a class below 3" in err, "a label out of range: exit %d, %r" % (code, err))
    print("selfcheck: refusals: padding inside a row, ids outside the vocabulary, too many columns, "
          "malformed ids and labels exit 2 with one line")


def cmd_selfcheck(a):
    tmp = a.keep or tempfile.mkdtemp(prefix="torchref-")
    os.makedirs(tmp, exist_ok=True)
    rng = random.Random(7)
    try:
        selfcheck_safetensors(tmp)
        for arch, seed in (("bert", 11), ("gpt2", 12)):
            d = os.path.join(tmp, arch)
            init = ["--seed", str(seed), "--labels", "3", "--std", "0.3", "--embed-std", "0.03"]
            run(["init", "--arch", arch, "--out", d] + init)
            c = read_config(d)
            # Real tokens avoid the pad and [SEP] ids, as tokenizers' do;
            # BERT's rows hold [SEP] inside, so that token type 1 is used.
            pick = lambda: rng.randrange(1, c.vocab - 1)
            if arch == "bert":
                rows = [[1] + [pick() for _ in range(3)] + [c.sep] + [pick() for _ in range(3)] + [c.sep],
                        [1, pick(), c.sep, pick(), c.sep, -1, -1],
                        [1, pick(), pick(), c.sep],
                        [pick() for _ in range(10)]]
            else:
                rows = [[pick() for _ in range(n)] + [-1] * (10 - n) for n in (10, 3, 7, 1)]
            labels = [rng.randrange(c.labels) for _ in rows]
            ref = selfcheck_padding(arch, d, rows, labels, c.positions)
            selfcheck_gradients(arch, d, rows, labels, ref, rng)
            selfcheck_load_check(arch, d, tmp)
            selfcheck_dtypes(arch, d, tmp, init)
        selfcheck_refusals(os.path.join(tmp, "bert"), tmp)
    except AssertionError as e:
        print("torchref: selfcheck failed: %s (files in %s)" % (e, tmp), file=sys.stderr)
        return 1
    if not a.keep:
        shutil.rmtree(tmp)
    print("selfcheck: ok")
    return 0


# ----------------------------------------------------------------------- main

def parser():
    p = argparse.ArgumentParser(prog="torchref.py", description="PyTorch reference for dpcluster's pretrained "
                                "BERT and GPT-2 conformance tests; see the module documentation.")
    sub = p.add_subparsers(dest="command", required=True)

    i = sub.add_parser("init", help="random checkpoint: DIR/config.json and DIR/model.safetensors")
    i.add_argument("--arch", choices=["bert", "gpt2"], required=True)
    i.add_argument("--out", required=True)
    i.add_argument("--seed", type=int, required=True)
    i.add_argument("--vocab", type=int, default=60)
    i.add_argument("--hidden", type=int, default=16)
    i.add_argument("--layers", type=int, default=2)
    i.add_argument("--heads", type=int, default=2)
    i.add_argument("--intermediate", type=int, default=64)
    i.add_argument("--max-positions", type=int, default=16)
    i.add_argument("--type-vocab", type=int, default=2)
    i.add_argument("--labels", type=int, default=2)
    i.add_argument("--ln-eps", type=float)
    i.add_argument("--pad", type=int)
    i.add_argument("--sep", type=int)
    i.add_argument("--std", type=float, default=0.02)
    i.add_argument("--embed-std", type=float)
    i.add_argument("--dtype", choices=["F32", "F16", "BF16"], default="F32")

    f = sub.add_parser("forward", help="logits, losses and per-example gradients in float64")
    f.add_argument("--dir", required=True)
    f.add_argument("--ids", required=True)
    f.add_argument("--labels")
    f.add_argument("--out", required=True)
    f.add_argument("--out-dtype", choices=["F32", "F64"], default="F32")
    f.add_argument("--sep", type=int)

    l = sub.add_parser("load-check", help="an exported checkpoint gives the expected logits")
    l.add_argument("--dir", required=True)
    l.add_argument("--ids", required=True)
    l.add_argument("--expect", required=True)
    l.add_argument("--tol", type=float, default=1e-4)
    l.add_argument("--sep", type=int)

    s = sub.add_parser("selfcheck", help="check this program on tiny models")
    s.add_argument("--keep", help="write into this folder and keep it")
    return p


COMMANDS = {"init": cmd_init, "forward": cmd_forward, "load-check": cmd_load_check, "selfcheck": cmd_selfcheck}


def main(argv):
    a = parser().parse_args(argv)
    torch.set_num_threads(1)  # small tensors; sums in one fixed order
    try:
        return COMMANDS[a.command](a)
    except InputError as e:
        print("torchref: %s: %s" % (a.command, e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
