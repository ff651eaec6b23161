"""Prints a safetensors tensor's integers comma-separated, or with --margin the gap between the
two largest values of its last row (a logits tensor). Debian's numpy only.
usage: tensor_ids.py FILE.safetensors NAME [--margin]"""
import json
import struct
import sys

import numpy as np

path, name = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    v = header[name]
    a, b = v["data_offsets"]
    f.seek(8 + n + a)
    dt = {"I64": np.int64, "I32": np.int32, "F32": np.float32}[v["dtype"]]
    x = np.frombuffer(f.read(b - a), dt).reshape(v["shape"])
if "--margin" in sys.argv:
    top = np.sort(x.reshape(-1, x.shape[-1])[-1])[-2:]
    print(f"{top[1] - top[0]:.4f}")
else:
    print(",".join(str(int(i)) for i in x.reshape(-1)))
