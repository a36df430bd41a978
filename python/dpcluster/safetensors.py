"""A reader of safetensors files with numpy only.

The format (https://github.com/huggingface/safetensors): an 8-byte
little-endian header length, a JSON header mapping each tensor's name to
its dtype, shape and byte range in the data (plus "__metadata__", a map of
strings), then the raw little-endian tensors.
"""

import json
import struct

import numpy as np

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1"}


class SafetensorsError(ValueError):
    """The file is not a safetensors file this package can read."""


def read(path):
    """Returns ({name: array}, metadata dict) of the file at path."""
    with open(path, "rb") as f:
        data = f.read()
    return parse(data, path)


def parse(data, name="<bytes>"):
    """Returns ({name: array}, metadata dict) of a safetensors file's bytes."""
    if len(data) < 8:
        raise SafetensorsError(f"{name}: {len(data)} bytes, not a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise SafetensorsError(f"{name}: a header of {n} bytes in a file of {len(data)}")
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError as e:
        raise SafetensorsError(f"{name}: the header is not JSON: {e}") from None
    meta = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + n :]
    tensors = {}
    for key, e in header.items():
        if e.get("dtype") not in DTYPES:
            raise SafetensorsError(f"{name}: tensor {key!r} has dtype {e.get('dtype')!r}")
        lo, hi = e["data_offsets"]
        dt = np.dtype(DTYPES[e["dtype"]])
        count = int(np.prod(e["shape"], dtype=np.int64))
        if not 0 <= lo <= hi <= len(body) or hi - lo != count * dt.itemsize:
            raise SafetensorsError(f"{name}: tensor {key!r}: bytes {lo}..{hi} do not hold {e['shape']} {e['dtype']}")
        tensors[key] = np.frombuffer(body[lo:hi], dtype=dt).reshape(e["shape"])
    return tensors, meta
