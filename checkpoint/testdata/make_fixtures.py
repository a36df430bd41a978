#!/usr/bin/env python3
"""Writes the checkpoint package's test fixtures with the standard library
only (struct, json, zlib): tiny Hugging Face checkpoint folders, each a
config.json and a model.safetensors, laid out as transformers'
save_pretrained and the safetensors library write them, and a file of
conversion cases whose expected float32 values come from Python's own
struct module.

    python3 make_fixtures.py [OUTDIR]   # OUTDIR defaults to this folder

The output is deterministic; checkpoint's TestFixturesAreFresh runs this
script and compares its output with the committed files.

Where the layout comes from:
  - safetensors (huggingface/safetensors, README "Format" and
    safetensors/src/tensor.rs `prepare`): an 8-byte little-endian header
    length, then compact JSON with "__metadata__" first and the tensors
    in data order, each {"dtype", "shape", "data_offsets"}, padded with
    spaces to a multiple of 8 bytes; tensors sorted by dtype, largest
    alignment first (the order of the Rust enum Dtype), then by name,
    and stored back to back. save_pretrained writes {"format": "pt"} as
    metadata.
  - config.json: PretrainedConfig.to_json_string, json.dumps(indent=2,
    sort_keys=True) plus a newline.
  - names and shapes: the modules of modeling_bert.py,
    modeling_roberta.py and modeling_gpt2.py (torch.nn.Linear stores
    [out, in], GPT-2's Conv1D [in, out]).

Tensor values: element j of tensor `name` is ((crc32(name) + 17*j) % 41
- 20) / 16, a multiple of 1/16 in [-1.25, 1.25], exact in F32, F16 and
BF16, so the Go test recomputes it.
"""

import json
import math
import os
import struct
import sys
import zlib

# The order of safetensors' Rust enum Dtype; `prepare` sorts by it,
# descending, then by name.
DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
               "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
               "C64", "F64", "I64", "U64"]


def value(name, j):
    return ((zlib.crc32(name.encode()) + 17 * j) % 41 - 20) / 16


def bf16_bits(x):
    """float32 x rounded to bfloat16, nearest even (torch's conversion)."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    if math.isnan(x):
        return (b >> 16) | 0x40
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def encode(dtype, values):
    if dtype == "F32":
        return b"".join(struct.pack("<f", v) for v in values)
    if dtype == "F16":
        return b"".join(struct.pack("<e", v) for v in values)
    if dtype == "BF16":
        return b"".join(struct.pack("<H", bf16_bits(v)) for v in values)
    if dtype == "F64":
        return b"".join(struct.pack("<d", v) for v in values)
    if dtype == "I64":
        return b"".join(struct.pack("<q", int(v)) for v in values)
    raise ValueError(dtype)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def safetensors(tensors):
    """tensors: list of (name, dtype, shape, data bytes)."""
    order = sorted(tensors, key=lambda t: (-DTYPE_ORDER.index(t[1]), t[0]))
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, data in order:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + b"".join(t[3] for t in order)


def patterned(dtype, names_shapes):
    return [(n, dtype, s, encode(dtype, [value(n, j) for j in range(numel(s))])) for n, s in names_shapes]


def linear(name, n_in, n_out):
    return [(name + ".weight", [n_out, n_in]), (name + ".bias", [n_out])]


def norm(name, n):
    return [(name + ".weight", [n]), (name + ".bias", [n])]


def conv1d(name, n_in, n_out):
    return [(name + ".weight", [n_in, n_out]), (name + ".bias", [n_out])]


def bert_body(base, c):
    h, out = c["hidden_size"], []
    out += [(base + "embeddings.word_embeddings.weight", [c["vocab_size"], h]),
            (base + "embeddings.position_embeddings.weight", [c["max_position_embeddings"], h]),
            (base + "embeddings.token_type_embeddings.weight", [c["type_vocab_size"], h])]
    out += norm(base + "embeddings.LayerNorm", h)
    for i in range(c["num_hidden_layers"]):
        l = "%sencoder.layer.%d." % (base, i)
        for part in ("query", "key", "value"):
            out += linear(l + "attention.self." + part, h, h)
        out += linear(l + "attention.output.dense", h, h)
        out += norm(l + "attention.output.LayerNorm", h)
        out += linear(l + "intermediate.dense", h, c["intermediate_size"])
        out += linear(l + "output.dense", c["intermediate_size"], h)
        out += norm(l + "output.LayerNorm", h)
    return out


def tiny_bert():
    """BertForPreTraining: the body with its pooler, the masked-LM and
    next-sentence heads, the decoder weight left out as tied to the word
    embedding, and the position_ids buffer that versions registering it
    as persistent saved (int64 [1, max_position_embeddings])."""
    c = {"architectures": ["BertForPreTraining"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
         "hidden_dropout_prob": 0.1, "hidden_size": 8, "initializer_range": 0.02, "intermediate_size": 16,
         "layer_norm_eps": 1e-12, "max_position_embeddings": 16, "model_type": "bert", "num_attention_heads": 2,
         "num_hidden_layers": 2, "pad_token_id": 0, "position_embedding_type": "absolute",
         "transformers_version": "4.30.2", "type_vocab_size": 2, "use_cache": True, "vocab_size": 24}
    h = c["hidden_size"]
    ps = bert_body("bert.", c) + linear("bert.pooler.dense", h, h)
    ps += linear("cls.predictions.transform.dense", h, h) + norm("cls.predictions.transform.LayerNorm", h)
    ps += [("cls.predictions.bias", [c["vocab_size"]])] + linear("cls.seq_relationship", h, 2)
    ts = patterned("F32", ps)
    ts.append(("bert.embeddings.position_ids", "I64", [1, 16], encode("I64", range(16))))
    return c, ts


def tiny_roberta():
    """RobertaForSequenceClassification saved in float16: the body without
    a pooler, RobertaClassificationHead (dense, out_proj), three labels."""
    c = {"architectures": ["RobertaForSequenceClassification"], "attention_probs_dropout_prob": 0.1,
         "bos_token_id": 0, "classifier_dropout": None, "eos_token_id": 2, "hidden_act": "gelu",
         "hidden_dropout_prob": 0.1, "hidden_size": 8, "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
         "initializer_range": 0.02, "intermediate_size": 16, "label2id": {"negative": 0, "neutral": 1, "positive": 2},
         "layer_norm_eps": 1e-05, "max_position_embeddings": 18, "model_type": "roberta", "num_attention_heads": 2,
         "num_hidden_layers": 2, "pad_token_id": 1, "position_embedding_type": "absolute",
         "problem_type": "single_label_classification", "torch_dtype": "float16",
         "transformers_version": "4.46.3", "type_vocab_size": 1, "use_cache": True, "vocab_size": 24}
    h = c["hidden_size"]
    ps = bert_body("roberta.", c) + linear("classifier.dense", h, h) + linear("classifier.out_proj", h, 3)
    return c, patterned("F16", ps)


def tiny_gpt2():
    """GPT2LMHeadModel in the form of openai-community/gpt2's checkpoint:
    the bare GPT2Model's names (no "transformer."), no lm_head (tied to
    wte), the attn.bias causal mask [1, 1, n_positions, n_positions] and
    attn.masked_bias scalar buffers; stored as bfloat16."""
    c = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
         "bos_token_id": 23, "embd_pdrop": 0.1, "eos_token_id": 23, "initializer_range": 0.02,
         "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 16, "n_embd": 8, "n_head": 2, "n_inner": None,
         "n_layer": 2, "n_positions": 16, "resid_pdrop": 0.1, "summary_activation": None,
         "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
         "summary_use_proj": True, "torch_dtype": "bfloat16", "vocab_size": 24}
    e, p = c["n_embd"], c["n_positions"]
    ps = [("wte.weight", [c["vocab_size"], e]), ("wpe.weight", [p, e])]
    for i in range(c["n_layer"]):
        l = "h.%d." % i
        ps += norm(l + "ln_1", e) + conv1d(l + "attn.c_attn", e, 3 * e) + conv1d(l + "attn.c_proj", e, e)
        ps += norm(l + "ln_2", e) + conv1d(l + "mlp.c_fc", e, 4 * e) + conv1d(l + "mlp.c_proj", 4 * e, e)
    ps += norm("ln_f", e)
    ts = patterned("BF16", ps)
    tril = [1.0 if col <= row else 0.0 for row in range(p) for col in range(p)]
    for i in range(c["n_layer"]):
        ts.append(("h.%d.attn.bias" % i, "BF16", [1, 1, p, p], encode("BF16", tril)))
        ts.append(("h.%d.attn.masked_bias" % i, "BF16", [], encode("BF16", [-1e4])))
    return c, ts


def f16_cases():
    """Every 61st binary16 pattern and the special ones; the expected
    float32 is struct's '<e' decoding (the value as a Python float)
    packed with '<f', exact."""
    pats = sorted(set(range(0, 1 << 16, 61)) | {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00,
                                                  0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01})
    src = b"".join(struct.pack("<H", p) for p in pats)
    want = b"".join(struct.pack("<f", struct.unpack("<e", struct.pack("<H", p))[0]) for p in pats)
    return [("f16", "F16", [len(pats)], src), ("f16.expected", "F32", [len(pats)], want)]


def f64_cases():
    """float64 values across float32's range, its subnormals and below,
    halfway cases and their neighbours; the expected float32 is struct's
    '<f' packing, which rounds to nearest even (C's double to float)."""
    xs, state = [], 12345
    for _ in range(600):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        mant = 1 + (state >> 11) / (1 << 53)
        exp = (state % 290) - 160  # 2^-160 .. 2^129
        x = math.ldexp(mant, exp) * (-1 if state & 1 else 1)
        if abs(x) < 3.4e38:
            xs.append(x)
    for k in range(1, 40):
        half = math.ldexp(1 + (2 * k + 1) * 2.0 ** -24, -k)  # halfway between two float32 values
        xs += [half, math.nextafter(half, 0), math.nextafter(half, math.inf), -half]
    xs += [math.ldexp(1, -149), math.ldexp(1, -150), math.ldexp(3, -151), math.ldexp(1, -126) * (1 - 2 ** -24),
           3.4028234663852886e38, 0.0, -0.0]
    src = b"".join(struct.pack("<d", x) for x in xs)
    want = b"".join(struct.pack("<f", x) for x in xs)
    return [("f64", "F64", [len(xs)], src), ("f64.expected", "F32", [len(xs)], want)]


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, make in (("tiny-bert", tiny_bert), ("tiny-roberta", tiny_roberta), ("tiny-gpt2", tiny_gpt2)):
        config, tensors = make()
        os.makedirs(os.path.join(out, name), exist_ok=True)
        write(os.path.join(out, name, "config.json"), (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
        write(os.path.join(out, name, "model.safetensors"), safetensors(tensors))
    write(os.path.join(out, "conversions.safetensors"), safetensors(f16_cases() + f64_cases()))


if __name__ == "__main__":
    main()
