"""safetensors reading and writing, and bf16 rounding, with numpy: what the test data
generators (tests/data/*/) share."""
import json
import struct

import numpy as np

DTYPES = {"BF16": np.uint16, "F32": np.float32, "U32": np.uint32, "F16": np.float16, "I64": np.int64,
          "I32": np.int32}


def read(path):
    """{name: (dtype, array)}; BF16 as its uint16 bits."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = (v["dtype"], np.frombuffer(data[a:b], DTYPES[v["dtype"]]).reshape(v["shape"]))
    return out


def write(path, tensors):
    """tensors: {name: (dtype, array)}, written in name order."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    """Round to nearest even (as mlx and ggml round)."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def as_f32(dtype, arr):
    return bf16_to_f32(arr) if dtype == "BF16" else arr.astype(np.float32)
