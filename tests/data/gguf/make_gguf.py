"""GGUF files for the importer's tests and the peer benchmark, written with gguf-py (llama.cpp's
own Python package, from the source archive in ../shared/peers) and numpy.

usage:
  make_gguf.py blocks OUT.gguf OUT_REF.safetensors
      one tensor of every block type the importer reads (gguf-py quantizes the types it can; the
      K-quants are random blocks with sane scales), and gguf-py's own dequantize of each (F32)
  make_gguf.py model HF_DIR OUT.gguf TYPE [REF_DIR]
      a Hugging Face Qwen3-MoE or Qwen3-Next checkpoint as llama.cpp's convert_hf_to_gguf.py
      writes it (conversion/qwen.py: tensor names, norms +1 for Qwen3-Next, A = -exp(A_log),
      conv1d squeezed, in_proj_qkvz split into attn_qkv and attn_gate, experts stacked, no MTP),
      2-D matrices as TYPE (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) where their rows are
      whole blocks, else Q8_0; with the tokenizer of HF_DIR/tokenizer.json when it has one.
      TYPE Q4_K, Q5_K or Q6_K (which gguf-py cannot quantize) writes random blocks of that type,
      and attn_gate as another K type: weights to check an import by, not a model to run.
      REF_DIR: the Hugging Face checkpoint of what the file holds (each matrix as gguf-py's
      dequantize of its blocks, float32), the reference an import is tested against.
  make_gguf.py model HF_DIR OUT.gguf TYPE REF_DIR --blocks-from QUANTIZED.gguf
      as above, but every tensor QUANTIZED.gguf holds is written with its blocks and type, as they
      are (a file llama-quantize wrote from one of HF_DIR's dims, e.g. tiny256-Q4_K_M.gguf), and
      REF_DIR holds their gguf-py dequantize.
  make_gguf.py tiny256 OUT_DIR
      a random Qwen3-MoE checkpoint whose every matrix has rows of 256 (K-quant super-blocks):
      what tests/data/gguf/tiny256-Q4_K_M.gguf was quantized from (llama-quantize Q4_K_M of its
      BF16 GGUF), with the same seed.
  make_gguf.py bad OUT_DIR
      damaged and foreign files for the error tests."""
import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import safetensors_np as st  # noqa: E402
from safetensors_np import as_f32, f32_to_bf16  # noqa: E402

QK = {t: gguf.GGML_QUANT_SIZES[t] for t in Q}


def read_safetensors(path):
    """{name: float32 array}"""
    return {name: as_f32(dtype, arr) for name, (dtype, arr) in st.read(path).items()}


def write_f32_safetensors(path, tensors):
    st.write(path, {name: ("F32", np.ascontiguousarray(v, dtype=np.float32)) for name, v in tensors.items()})


def random_k_blocks(qtype, n_blocks, rng):
    """Random bytes, with the f16 super-block scales (and Q4_K/Q5_K mins) set to sane values."""
    size = QK[qtype][1]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scale = lambda: rng.uniform(1e-3, 5e-2, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    if qtype in (Q.Q4_K, Q.Q5_K):
        raw[:, 0:2], raw[:, 2:4] = scale(), scale()
    else:  # Q6_K: d is the last two bytes
        raw[:, size - 2:] = scale()
    return raw


def blocks(out, ref_path):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(out, "blocktest")
    ref = {}
    rows, cols = 4, 512
    data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    data[0, :32] = 0.0  # an all-zero block
    for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        raw = gguf.quants.quantize(data, qtype)
        name = f"t.{qtype.name}"
        w.add_tensor(name, raw, raw_dtype=qtype)
        ref[name] = gguf.quants.dequantize(raw, qtype).reshape(rows, cols)
    for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        raw = random_k_blocks(qtype, rows * cols // 256, rng).reshape(rows, -1)
        name = f"t.{qtype.name}"
        w.add_tensor(name, raw, raw_dtype=qtype)
        ref[name] = gguf.quants.dequantize(raw, qtype).reshape(rows, cols)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_f32_safetensors(ref_path, ref)


NEXT_PLUS_ONE = ("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight", "q_norm.weight",
                 "k_norm.weight")


def source_blocks(path):
    """{name: (raw blocks or values, GGML type)} of every tensor of a GGUF file."""
    if path is None:
        return {}
    return {t.name: (np.array(t.data), Q(t.tensor_type)) for t in gguf.GGUFReader(path).tensors}


def model(hf_dir, out, qtype_name, ref_dir=None, blocks_from=None):
    qtype = Q[qtype_name]
    ref = {}
    source = source_blocks(blocks_from)
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    next_arch = cfg["architectures"][0] == "Qwen3NextForCausalLM"
    arch = "qwen3next" if next_arch else "qwen3moe"
    t = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    E = cfg.get("num_experts", cfg.get("num_local_experts"))
    heads, hd = cfg["num_attention_heads"], cfg.get("head_dim", H // cfg["num_attention_heads"])
    rope = cfg.get("rope_parameters", {})
    w = gguf.GGUFWriter(out, arch)
    w.add_name(os.path.basename(hf_dir.rstrip("/")))
    w.add_block_count(L)
    w.add_context_length(cfg.get("max_position_embeddings", 32768))
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg.get("intermediate_size", 0))
    w.add_head_count(heads)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if next_arch:
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
        w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
        w.add_ssm_state_size(cfg["linear_key_head_dim"])
        w.add_ssm_group_count(cfg["linear_num_key_heads"])
        w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
        w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
        w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
        partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
        w.add_rope_dimension_count(int(hd * partial))
    if "bos_token_id" in cfg and cfg["bos_token_id"] is not None:
        w.add_bos_token_id(cfg["bos_token_id"])
    if "eos_token_id" in cfg and cfg["eos_token_id"] is not None:
        w.add_eos_token_id(cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], int) else cfg["eos_token_id"][0])
    add_tokenizer(w, hf_dir)

    rng = np.random.default_rng(11)
    k_types = (Q.Q4_K, Q.Q5_K, Q.Q6_K)

    def write(name, arr, matrix):
        """Writes arr as the type it takes (or as the blocks `source` holds); returns what the file holds."""
        if name in source:  # the blocks another tool wrote, as they are
            raw, have = source[name]
            if have in (Q.F32, Q.F16):
                w.add_tensor(name, raw)
                return raw.astype(np.float32)
            w.add_tensor(name, raw, raw_dtype=have)
            return gguf.quants.dequantize(raw, have)
        want = qtype if matrix and arr.ndim >= 2 else Q.F32
        if want in k_types and name.endswith("attn_gate.weight"):  # meets attn_qkv in a wider layout
            want = Q.Q6_K if want != Q.Q6_K else Q.Q4_K
        if want not in (Q.F32, Q.F16, Q.BF16) and arr.shape[-1] % QK[want][0] != 0:
            want = Q.Q8_0 if arr.shape[-1] % 32 == 0 else Q.F32
        if want in k_types:  # gguf-py cannot quantize these: random blocks, the weights what they say
            raw = random_k_blocks(want, arr.size // 256, rng).reshape(*arr.shape[:-1], -1)
            w.add_tensor(name, raw, raw_dtype=want)
            return gguf.quants.dequantize(raw, want)
        if want == Q.BF16:
            raw = f32_to_bf16(arr)
            w.add_tensor(name, raw, raw_shape=list(arr.shape), raw_dtype=Q.BF16)
            return (raw.astype(np.uint32) << 16).view(np.float32)
        raw = gguf.quants.quantize(arr, want)
        if want in (Q.F32, Q.F16):
            w.add_tensor(name, raw)
            return raw.astype(np.float32)
        w.add_tensor(name, raw, raw_dtype=want)
        return gguf.quants.dequantize(raw, want)

    def put(name, arr, matrix=True, hf=None):
        """hf: the checkpoint tensor names the GGUF tensor holds (experts: one per expert)."""
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        held = write(name, arr, matrix).reshape(arr.shape)
        if hf is not None and matrix:
            for i, n in enumerate(hf):
                ref[n] = held[i] if len(hf) > 1 else held
        return held

    norm = lambda name, v: v + np.float32(1) if next_arch and name.endswith(NEXT_PLUS_ONE) else v
    put("token_embd.weight", t["model.embed_tokens.weight"], hf=["model.embed_tokens.weight"])
    if "lm_head.weight" in t and not cfg.get("tie_word_embeddings", False):
        put("output.weight", t["lm_head.weight"], hf=["lm_head.weight"])
    put("output_norm.weight", norm("model.norm.weight", t["model.norm.weight"]), matrix=False)
    for l in range(L):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        put(b + "attn_norm.weight", norm("input_layernorm.weight", t[p + "input_layernorm.weight"]), False)
        post = "post_attention_norm.weight" if next_arch else "ffn_norm.weight"
        put(b + post, norm("post_attention_layernorm.weight", t[p + "post_attention_layernorm.weight"]), False)
        if p + "self_attn.q_proj.weight" in t:
            a = p + "self_attn."
            for src, dst in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                put(b + dst + ".weight", t[a + src + ".weight"], hf=[a + src + ".weight"])
            put(b + "attn_q_norm.weight", norm("q_norm.weight", t[a + "q_norm.weight"]), False)
            put(b + "attn_k_norm.weight", norm("k_norm.weight", t[a + "k_norm.weight"]), False)
        else:
            a = p + "linear_attn."
            nk, hk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
            vz = cfg["linear_num_value_heads"] // nk * cfg["linear_value_head_dim"]
            qkvz = t[a + "in_proj_qkvz.weight"].reshape(nk, 2 * hk + 2 * vz, H)
            q, k, v, z = np.split(qkvz, [hk, 2 * hk, 2 * hk + vz], axis=1)
            qkv = put(b + "attn_qkv.weight", np.concatenate([q.reshape(-1, H), k.reshape(-1, H), v.reshape(-1, H)]))
            zh = put(b + "attn_gate.weight", z.reshape(-1, H)).reshape(nk, vz, H)
            qh, kh, vh = np.split(qkv, [nk * hk, 2 * nk * hk])
            ref[a + "in_proj_qkvz.weight"] = np.concatenate(
                [qh.reshape(nk, hk, H), kh.reshape(nk, hk, H), vh.reshape(nk, vz, H), zh], axis=1).reshape(-1, H)
            put(b + "ssm_ba.weight", t[a + "in_proj_ba.weight"], hf=[a + "in_proj_ba.weight"])
            put(b + "ssm_out.weight", t[a + "out_proj.weight"], hf=[a + "out_proj.weight"])
            put(b + "ssm_conv1d.weight", t[a + "conv1d.weight"].squeeze(1), False)
            put(b + "ssm_a", -np.exp(t[a + "A_log"]), False)
            put(b + "ssm_dt.bias", t[a + "dt_bias"], False)
            put(b + "ssm_norm.weight", t[a + "norm.weight"], False)
        m = p + "mlp."
        put(b + "ffn_gate_inp.weight", t[m + "gate.weight"], False)
        for proj, dst in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            names = [f"{m}experts.{e}.{proj}.weight" for e in range(E)]
            put(b + dst + ".weight", np.stack([t[n] for n in names]), hf=names)
        if m + "shared_expert_gate.weight" in t:
            put(b + "ffn_gate_inp_shexp.weight", t[m + "shared_expert_gate.weight"].reshape(-1), False)
            for proj, dst in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")):
                put(b + dst + ".weight", t[f"{m}shared_expert.{proj}.weight"], hf=[f"{m}shared_expert.{proj}.weight"])
    w.add_file_type(int(qtype) if qtype != Q.BF16 else 32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if ref_dir:
        os.makedirs(ref_dir, exist_ok=True)
        for name, v in t.items():
            if name not in ref and not name.startswith("mtp."):
                ref[name] = v
        write_f32_safetensors(os.path.join(ref_dir, "model.safetensors"), ref)
        with open(os.path.join(ref_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)


def add_tokenizer(w, hf_dir):
    path = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.exists(path):
        return
    tj = json.load(open(path))
    vocab = tj["model"]["vocab"]
    n = max(max(vocab.values()), max(a["id"] for a in tj["added_tokens"])) + 1
    toks, types = [f"[PAD{i}]" for i in range(n)], [gguf.TokenType.UNUSED] * n
    for tok, i in vocab.items():
        toks[i], types[i] = tok, gguf.TokenType.NORMAL
    for a in tj["added_tokens"]:
        toks[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    tc = os.path.join(hf_dir, "tokenizer_config.json")
    if os.path.exists(tc) and "chat_template" in json.load(open(tc)):
        w.add_chat_template(json.load(open(tc))["chat_template"])


def tiny256(out_dir):
    H, L, E, I, V, HD = 256, 2, 8, 256, 512, 128
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H,
           "intermediate_size": 512, "num_hidden_layers": L, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": HD, "num_local_experts": E, "num_experts_per_tok": 2, "moe_intermediate_size": I,
           "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-06,
           "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "max_position_embeddings": 4096,
           "vocab_size": V, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
           "hidden_act": "silu", "attention_bias": False}
    rng = np.random.default_rng(256)
    mat = lambda r, c: (rng.standard_normal((r, c)) * 0.05).astype(np.float32)
    norm = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    t = {"model.embed_tokens.weight": mat(V, H), "lm_head.weight": mat(V, H), "model.norm.weight": norm(H)}
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"], t[p + "post_attention_layernorm.weight"] = norm(H), norm(H)
        t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"] = mat(2 * HD, H), mat(HD, H)
        t[p + "self_attn.v_proj.weight"], t[p + "self_attn.o_proj.weight"] = mat(HD, H), mat(H, 2 * HD)
        t[p + "self_attn.q_norm.weight"], t[p + "self_attn.k_norm.weight"] = norm(HD), norm(HD)
        t[p + "mlp.gate.weight"] = mat(E, H)
        for e in range(E):
            for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                t[f"{p}mlp.experts.{e}.{proj}.weight"] = mat(*shape)
    os.makedirs(out_dir, exist_ok=True)
    write_f32_safetensors(os.path.join(out_dir, "model.safetensors"), t)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def bad(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    w = gguf.GGUFWriter(os.path.join(out_dir, "foreign.gguf"), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    w = gguf.GGUFWriter(os.path.join(out_dir, "unknown_type.gguf"), "qwen3moe")
    w.add_tensor("token_embd.weight", np.zeros((4, 84), np.uint8), raw_dtype=Q.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    args = sys.argv[2:]
    blocks_from = None
    if "--blocks-from" in args:
        at = args.index("--blocks-from")
        blocks_from = args[at + 1]
        del args[at:at + 2]
    {"blocks": lambda: blocks(*args[:2]), "model": lambda: model(*args[:4], blocks_from=blocks_from),
     "tiny256": lambda: tiny256(args[0]), "bad": lambda: bad(args[0])}[sys.argv[1]]()
