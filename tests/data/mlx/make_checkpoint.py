"""Writes an MLX-layout quantized checkpoint of a Hugging Face fixture, as mlx-lm would, and the
Hugging Face checkpoint of its dequantized weights (the reference the import is tested against).

Written from the public format (mlx-lm: models/qwen3_next.py and qwen3_moe.py `sanitize` and
`quant_predicate`, utils.py `quantize_model`; mlx: affine quantization), with numpy only:
- experts stacked as `{layer}.mlp.switch_mlp.{gate,up,down}_proj.*` [E, ...], no `mtp.*`;
- a quantized Linear/Embedding `{path}` is `{path}.weight` uint32 (the codes of a row as one
  little-endian bit stream, value i in bits [i*bits, (i+1)*bits)), `{path}.scales` and
  `{path}.biases` [rows, cols/group] in the weight dtype (bf16): w = scale*q + bias;
- config.json `quantization` = {group_size, bits, mode} plus one entry per module that differs;
- Qwen3-Next: zero-centred norms stored as w+1 (rounded to bf16), conv1d as [C, K, 1].

usage: make_checkpoint.py SRC_HF_DIR OUT_MLX_DIR OUT_REF_DIR CASE
CASE: "default" (4-bit g64, routers 8-bit g64: mlx-lm's predicate), "mixed" (per-module bits
2 to 8 and groups, a module left unquantized) or "f16" (the default as a float16 model: f16
scales and biases)."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_np import as_f32, bf16_to_f32, f32_to_bf16  # noqa: E402
from safetensors_np import read as read_safetensors  # noqa: E402
from safetensors_np import write as write_safetensors  # noqa: E402

def pack_rows(q, bits):
    """[rows, cols] codes -> [rows, cols*bits/32] uint32, one little-endian bit stream a row."""
    rows, cols = q.shape
    bit = np.arange(bits, dtype=np.uint64)
    stream = ((q.astype(np.uint64)[:, :, None] >> bit) & 1).astype(np.uint8).reshape(rows, cols * bits)
    packed = np.packbits(stream, axis=1, bitorder="little")
    return packed.view(np.uint32).reshape(rows, cols * bits // 32)


SCALE_DTYPE = "BF16"  # of scales and biases: the model's dtype


def to_scale(f):
    return f32_to_bf16(f) if SCALE_DTYPE == "BF16" else np.asarray(f, np.float32).astype(np.float16)


def from_scale(a):
    return bf16_to_f32(a) if SCALE_DTYPE == "BF16" else a.astype(np.float32)


def quantize(w, bits, group):
    """mlx affine: per group, scale = (max - min) / (2^bits - 1), bias = min, in the model dtype."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    lo, hi = g.min(axis=2), g.max(axis=2)
    scale = to_scale(np.maximum((hi - lo) / (2**bits - 1), 1e-7))
    bias = to_scale(lo)
    s, b = from_scale(scale)[:, :, None], from_scale(bias)[:, :, None]
    q = np.clip(np.rint((g - b) / s), 0, 2**bits - 1).astype(np.uint32).reshape(rows, cols)
    return pack_rows(q, bits), scale, bias, q


def dequantize(q, scale, bias, group):
    rows, cols = q.shape
    s = np.repeat(from_scale(scale), group, axis=1)
    b = np.repeat(from_scale(bias), group, axis=1)
    return (s * q.astype(np.float32) + b).astype(np.float32)


NEXT_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight",
              ".k_norm.weight")


def module_params(case, path, default):
    """mlx-lm's quant_predicate, plus the mixed case's per-module choices (None: not quantized)."""
    if path.endswith("mlp.gate") or path.endswith("shared_expert_gate"):
        return {"group_size": 64, "bits": 8}
    if case != "mixed":
        return default
    if path.endswith("switch_mlp.down_proj"):
        return {"group_size": 32, "bits": 8}
    if path.endswith("switch_mlp.up_proj") and ".layers.1." in path:
        return {"group_size": 128, "bits": 2}
    if path.endswith("switch_mlp.gate_proj") and ".layers.2." in path:
        return {"group_size": 64, "bits": 3}
    if path.endswith("switch_mlp.gate_proj") and ".layers.3." in path:
        return {"group_size": 64, "bits": 6}
    if path.endswith("switch_mlp.up_proj") and ".layers.3." in path:
        return {"group_size": 32, "bits": 5}
    if path.endswith("q_proj") or path.endswith("in_proj_qkvz"):
        return {"group_size": 128, "bits": 5}
    if path.endswith("k_proj") or path.endswith("v_proj"):
        return {"group_size": 32, "bits": 6}
    if path.endswith("o_proj") or path.endswith("out_proj"):
        return None
    if path == "model.embed_tokens" or path == "lm_head":
        return {"group_size": 32, "bits": 8}
    return default


def main():
    global SCALE_DTYPE
    src, out, ref_dir, case = sys.argv[1:5]
    if case == "f16":
        SCALE_DTYPE = "F16"
    cfg = json.load(open(os.path.join(src, "config.json")))
    next_arch = cfg["architectures"][0] == "Qwen3NextForCausalLM"
    n_experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    hf = read_safetensors(os.path.join(src, "model.safetensors"))
    default = {"group_size": 64, "bits": 4}
    quant_cfg = dict(default, mode="affine")
    mlx, ref = {}, {}

    def put_matrix(path, w, ref_names):
        """w: [rows, cols] float32 (or [E, rows, cols]); writes the MLX tensors and the reference."""
        params = module_params(case, path, default)
        if params != default:
            quant_cfg[path] = params if params is not None else False
        stacked = w if w.ndim == 3 else w[None]
        if params is None:
            mlx[path + ".weight"] = ("BF16", f32_to_bf16(w))
            for i, name in enumerate(ref_names):
                ref[name] = ("BF16", f32_to_bf16(stacked[i]))
            return
        parts = [quantize(m, params["bits"], params["group_size"]) for m in stacked]
        pick = lambda k: np.stack([p[k] for p in parts]) if w.ndim == 3 else parts[0][k]
        mlx[path + ".weight"] = ("U32", pick(0))
        mlx[path + ".scales"] = (SCALE_DTYPE, pick(1))
        mlx[path + ".biases"] = (SCALE_DTYPE, pick(2))
        for i, name in enumerate(ref_names):
            _, scale, bias, q = parts[i]
            ref[name] = ("F32", dequantize(q, scale, bias, params["group_size"]))

    layers = cfg["num_hidden_layers"]
    for layer in range(layers):
        p = f"model.layers.{layer}.mlp"
        if f"{p}.experts.0.up_proj.weight" not in hf:
            continue
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names = [f"{p}.experts.{e}.{proj}.weight" for e in range(n_experts)]
            w = np.stack([as_f32(*hf[n]) for n in names])
            put_matrix(f"{p}.switch_mlp.{proj}", w, names)
            for n in names:
                del hf[n]
    for name in sorted(hf):
        dtype, arr = hf[name]
        if name.startswith("mtp."):
            continue  # mlx-lm drops the MTP head
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module and arr.ndim == 2 and (module.endswith("_proj") or module.endswith(".gate") or
                                          module.endswith("shared_expert_gate") or module in ("model.embed_tokens", "lm_head")):
            if arr.shape[1] % 64 == 0:
                put_matrix(module, as_f32(dtype, arr), [name])
                continue
        if next_arch and arr.ndim == 1 and any(name.endswith(s) for s in NEXT_NORMS):
            plus_one = f32_to_bf16(bf16_to_f32(arr) + np.float32(1))
            mlx[name] = ("BF16", plus_one)
            ref[name] = ("F32", bf16_to_f32(plus_one) - np.float32(1))
            continue
        if "conv1d.weight" in name and arr.shape[-1] != 1:
            mlx[name] = (dtype, np.moveaxis(arr, 2, 1))
            ref[name] = (dtype, arr)
            continue
        mlx[name] = (dtype, arr)
        ref[name] = (dtype, arr)

    for d in (out, ref_dir):
        os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), mlx)
    write_safetensors(os.path.join(ref_dir, "model.safetensors"), ref)
    mlx_cfg = dict(cfg, quantization=quant_cfg, quantization_config=quant_cfg)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(mlx_cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(ref_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
