#include "writers/import_gguf.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/ranges.h>

#include "format/config.h"
#include "format/engine_dir.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "quant/gguf_blocks.h"
#include "util/error.h"
#include "writers/convert_parts.h"
#include "writers/engine_writer.h"

namespace ms {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

enum class Family { Qwen3Moe, Qwen3Next };

// ---- config.json from the metadata ----

struct Meta {
  const GgufFile& f;
  std::string arch;  // general.architecture
  int64_t i(const std::string& key) const { return f.integer(arch + "." + key); }
  double d(const std::string& key) const { return f.number(arch + "." + key); }
  bool has(const std::string& key) const { return f.has(arch + "." + key); }
};

json make_config(const GgufFile& f, Family family, const std::string& arch) {
  const Meta m{f, arch};
  const int64_t layers = m.i("block_count"), heads = m.i("attention.head_count");
  const int64_t head_dim = m.has("attention.key_length") ? m.i("attention.key_length") : m.i("embedding_length") / heads;
  const GgufTensor& embed = f.tensor("token_embd.weight");
  json c = {
      {"hidden_size", m.i("embedding_length")},
      {"num_hidden_layers", layers},
      {"num_attention_heads", heads},
      {"num_key_value_heads", m.has("attention.head_count_kv") ? m.i("attention.head_count_kv") : heads},
      {"head_dim", head_dim},
      {"rms_norm_eps", m.d("attention.layer_norm_rms_epsilon")},
      {"rope_theta", m.has("rope.freq_base") ? m.d("rope.freq_base") : 10000.0},
      {"max_position_embeddings", m.has("context_length") ? m.i("context_length") : 32768},
      {"vocab_size", embed.rows()},
      {"num_experts", m.i("expert_count")},
      {"num_experts_per_tok", m.i("expert_used_count")},
      {"moe_intermediate_size", m.i("expert_feed_forward_length")},
      {"intermediate_size", m.has("feed_forward_length") ? m.i("feed_forward_length") : 0},
      {"norm_topk_prob", true},  // llama.cpp's qwen3moe and qwen3next graphs normalise the top-k weights
      {"tie_word_embeddings", !f.has_tensor("output.weight")},
      {"mlp_only_layers", json::array()},
      {"decoder_sparse_step", 1},
  };
  if (f.has("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = f.integer("tokenizer.ggml.bos_token_id");
  if (f.has("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = f.integer("tokenizer.ggml.eos_token_id");
  if (family == Family::Qwen3Moe) {
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["model_type"] = "qwen3_moe";
    return c;
  }
  c["architectures"] = {"Qwen3NextForCausalLM"};
  c["model_type"] = "qwen3_next";
  c["shared_expert_intermediate_size"] = m.i("expert_shared_feed_forward_length");
  c["linear_conv_kernel_dim"] = m.i("ssm.conv_kernel");
  c["linear_key_head_dim"] = m.i("ssm.state_size");
  c["linear_num_key_heads"] = m.i("ssm.group_count");
  const int64_t nv = m.i("ssm.time_step_rank");
  c["linear_num_value_heads"] = nv;
  c["linear_value_head_dim"] = m.i("ssm.inner_size") / nv;
  c["partial_rotary_factor"] = double(m.i("rope.dimension_count")) / double(head_dim);
  const int64_t interval = m.has("full_attention_interval") ? m.i("full_attention_interval") : 4;
  json types = json::array();
  for (int64_t l = 0; l < layers; ++l) types.push_back((l + 1) % interval == 0 ? "full_attention" : "linear_attention");
  c["layer_types"] = types;
  return c;
}

// ---- the tokenizer from tokenizer.ggml.* ----

// Qwen2's pre-tokenizer (tokenizer.ggml.pre "qwen2"), as Qwen's tokenizer.json spells it.
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

void write_json(const fs::path& p, const json& j) { write_text_file(p, j.dump(2) + "\n"); }

// A file without tokenizer.ggml.model gets none (the engine then takes token ids only).
void write_tokenizer(const GgufFile& f, const fs::path& dir) {
  if (!f.has("tokenizer.ggml.model")) return;
  const std::string model = f.string("tokenizer.ggml.model");
  if (model != "gpt2") fail("{}: tokenizer.ggml.model '{}' is not supported (gpt2: byte-level BPE)", f.path(), model);
  const std::string pre = f.has("tokenizer.ggml.pre") ? f.string("tokenizer.ggml.pre") : "";
  if (pre != "qwen2") fail("{}: tokenizer.ggml.pre '{}' is not supported (qwen2)", f.path(), pre);
  const json& tokens = f.meta("tokenizer.ggml.tokens");
  const json& types = f.meta("tokenizer.ggml.token_type");
  const json& merges = f.meta("tokenizer.ggml.merges");
  if (!tokens.is_array() || !types.is_array() || tokens.size() != types.size())
    fail("{}: tokenizer.ggml.tokens and tokenizer.ggml.token_type must be lists of one length", f.path());
  json vocab = json::object(), added = json::array(), decoder = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string text = tokens[id].get<std::string>();
    const int type = types[id].get<int>();
    if (type == 1) {  // normal
      vocab[text] = id;
    } else if (type == 3 || type == 4) {  // control, user-defined
      added.push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", type == 3}});
      decoder[std::to_string(id)] = {{"content", text}, {"special", type == 3}, {"lstrip", false}, {"rstrip", false},
                                     {"normalized", false}, {"single_word", false}};
    }
  }
  json merge_list = json::array();
  for (const json& m : merges) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    if (space == std::string::npos) fail("{}: tokenizer.ggml.merges entry '{}' is not two tokens", f.path(), s);
    merge_list.push_back({s.substr(0, space), s.substr(space + 1)});
  }
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  const json tok = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Split}}}, {"behavior", "Isolated"}, {"invert", false}},
          byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merge_list}}},
  };
  write_json(dir / "tokenizer.json", tok);
  auto token_text = [&](const char* key) -> json {
    if (!f.has(key)) return nullptr;
    const int64_t id = f.integer(key);
    if (id < 0 || size_t(id) >= tokens.size()) fail("{}: {} {} is outside the vocabulary", f.path(), key, id);
    return tokens[size_t(id)];
  };
  json cfg = {{"tokenizer_class", "Qwen2Tokenizer"},
              {"added_tokens_decoder", decoder},
              {"bos_token", token_text("tokenizer.ggml.bos_token_id")},
              {"eos_token", token_text("tokenizer.ggml.eos_token_id")},
              {"pad_token", token_text("tokenizer.ggml.padding_token_id")}};
  if (f.has("tokenizer.chat_template")) cfg["chat_template"] = f.string("tokenizer.chat_template");
  write_json(dir / "tokenizer_config.json", cfg);
  json gen = {{"do_sample", false}};
  if (f.has("tokenizer.ggml.eos_token_id")) gen["eos_token_id"] = f.integer("tokenizer.ggml.eos_token_id");
  if (f.has("tokenizer.ggml.bos_token_id")) gen["bos_token_id"] = f.integer("tokenizer.ggml.bos_token_id");
  write_json(dir / "generation_config.json", gen);
}

// ---- the tensors ----

// Rows [first, first + count) of a GGUF tensor seen as [rows, row_length].
struct Rows {
  const GgufTensor* t;
  int64_t first, count;
};

enum class Kind { Raw, NormMinusOne, Affine };

// One engine tensor of dense.safetensors and where its rows come from, in order.
struct DenseOut {
  std::string name;
  Kind kind = Kind::Raw;
  std::vector<Rows> parts;
  std::vector<int64_t> shape;  // the checkpoint's shape (Raw, NormMinusOne)
  DType dtype = DType::F32;    // Raw
  GgufAffine layout;           // Affine
  int64_t rows = 0, cols = 0;
  size_t first_spec = 0;
};

DType raw_dtype(const GgufFile& f, const GgufTensor& t) {
  switch (GgmlType(t.type)) {
    case GgmlType::F32: return DType::F32;
    case GgmlType::F16: return DType::F16;
    case GgmlType::BF16: return DType::BF16;
    default: fail("{}: tensor '{}' is {}, where a float tensor (F32, F16, BF16) is expected", f.path(), t.name, ggml_type_name(t.type));
  }
}

bool is_float_type(uint32_t type) {
  return type == uint32_t(GgmlType::F32) || type == uint32_t(GgmlType::F16) || type == uint32_t(GgmlType::BF16);
}

// The layout that holds every part's own exactly (the widest bits, the smallest group, f32 scales
// where the parts' differ).
GgufAffine common_layout(const GgufFile& f, const std::vector<Rows>& parts) {
  GgufAffine out;
  for (size_t i = 0; i < parts.size(); ++i) {
    GgufAffine a;
    if (!gguf_affine_layout(parts[i].t->type, &a))
      fail("{}: tensor '{}' is {}, which does not mix with {}", f.path(), parts[i].t->name, ggml_type_name(parts[i].t->type),
           ggml_type_name(parts[0].t->type));
    if (i == 0) {
      out = a;
      continue;
    }
    out.bits = std::max(out.bits, a.bits);
    out.group = std::min(out.group, a.group);
    if (out.scale_type != a.scale_type) out.scale_type = ScaleType::F32;
  }
  return out;
}

class Planner {
 public:
  explicit Planner(const GgufFile& f) : f_(f) {}

  // A whole GGUF tensor as the checkpoint tensor `name` of `shape` (the checkpoint's order).
  void tensor(const std::string& gguf, const std::string& name, std::vector<int64_t> shape, bool norm = false) {
    const GgufTensor& t = f_.tensor(gguf);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    int64_t have = 1;
    for (int64_t d : t.ne) have *= d;
    if (n != have || (shape.size() >= 2 && shape.back() != t.row_length()))
      fail("{}: tensor '{}' has shape [{}], which does not fit {} of the model its metadata describes", f_.path(), gguf,
           fmt::join(t.ne, ", "), name);
    add(name, {Rows{&t, 0, t.rows()}}, shape, norm);
  }

  // Several GGUF tensors' rows as one checkpoint matrix [rows, cols].
  void rows(const std::string& name, std::vector<Rows> parts, int64_t cols) {
    int64_t rows = 0;
    for (const Rows& r : parts) {
      if (r.t->row_length() != cols || r.first + r.count > r.t->rows())
        fail("{}: tensor '{}' has shape [{}], which does not fit {}", f_.path(), r.t->name, fmt::join(r.t->ne, ", "), name);
      rows += r.count;
    }
    add(name, std::move(parts), {rows, cols}, false);
  }

  std::vector<DenseOut>& outs() { return outs_; }

 private:
  void add(const std::string& name, std::vector<Rows> parts, std::vector<int64_t> shape, bool norm) {
    DenseOut o;
    o.name = name;
    o.parts = std::move(parts);
    o.shape = shape;
    o.cols = shape.back();
    o.rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) o.rows *= shape[i];
    const GgufTensor& first = *o.parts[0].t;
    if (is_float_type(first.type)) {
      o.dtype = raw_dtype(f_, first);
      for (const Rows& r : o.parts)
        if (r.t->type != first.type)
          fail("{}: tensors '{}' and '{}' make one matrix {} but have types {} and {}", f_.path(), first.name, r.t->name,
               name, ggml_type_name(first.type), ggml_type_name(r.t->type));
      if (norm) {
        if (o.dtype != DType::F32) fail("{}: norm tensor '{}' is {}, expected F32", f_.path(), first.name, ggml_type_name(first.type));
        o.kind = Kind::NormMinusOne;
      }
    } else {
      if (shape.size() != 2) fail("{}: tensor '{}' is quantized but {} is not a matrix", f_.path(), first.name, name);
      o.kind = Kind::Affine;
      o.layout = common_layout(f_, o.parts);
    }
    outs_.push_back(std::move(o));
  }

  const GgufFile& f_;
  std::vector<DenseOut> outs_;
};

// Qwen3-Next's in_proj_qkvz from llama.cpp's attn_qkv ([q of every key head; k ...; v ...]) and
// attn_gate (z): the checkpoint interleaves them per key head, [q_g, k_g, v_g, z_g].
std::vector<Rows> qkvz_rows(const GgufFile& f, int layer, const ModelConfig& cfg) {
  const GgufTensor& qkv = f.tensor(fmt::format("blk.{}.attn_qkv.weight", layer));
  const GgufTensor& z = f.tensor(fmt::format("blk.{}.attn_gate.weight", layer));
  const int64_t nk = cfg.lin_k_heads, hk = cfg.lin_k_dim, vz = int64_t(cfg.lin_v_heads / cfg.lin_k_heads) * cfg.lin_v_dim;
  std::vector<Rows> parts;
  for (int64_t g = 0; g < nk; ++g) {
    parts.push_back({&qkv, g * hk, hk});
    parts.push_back({&qkv, nk * hk + g * hk, hk});
    parts.push_back({&qkv, 2 * nk * hk + g * vz, vz});
    parts.push_back({&z, g * vz, vz});
  }
  return parts;
}

std::vector<DenseOut> plan_dense(const GgufFile& f, Family family, const ModelConfig& cfg) {
  Planner p(f);
  const int64_t H = cfg.hidden, V = cfg.vocab, hd = cfg.head_dim;
  const bool next = family == Family::Qwen3Next;
  p.tensor("token_embd.weight", "model.embed_tokens.weight", {V, H});
  if (f.has_tensor("output.weight")) p.tensor("output.weight", "lm_head.weight", {V, H});
  p.tensor("output_norm.weight", "model.norm.weight", {H}, next);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l), m = fmt::format("model.layers.{}.", l);
    p.tensor(b + "attn_norm.weight", m + "input_layernorm.weight", {H}, next);
    p.tensor(b + (next ? "post_attention_norm.weight" : "ffn_norm.weight"), m + "post_attention_layernorm.weight", {H}, next);
    if (cfg.layer_types[size_t(l)] == LayerType::FullAttention) {
      const std::string a = m + "self_attn.";
      p.tensor(b + "attn_q.weight", a + "q_proj.weight", {int64_t(cfg.n_heads) * hd * (next ? 2 : 1), H});
      p.tensor(b + "attn_k.weight", a + "k_proj.weight", {int64_t(cfg.n_kv_heads) * hd, H});
      p.tensor(b + "attn_v.weight", a + "v_proj.weight", {int64_t(cfg.n_kv_heads) * hd, H});
      p.tensor(b + "attn_output.weight", a + "o_proj.weight", {H, int64_t(cfg.n_heads) * hd});
      p.tensor(b + "attn_q_norm.weight", a + "q_norm.weight", {hd}, next);
      p.tensor(b + "attn_k_norm.weight", a + "k_norm.weight", {hd}, next);
    } else {
      const std::string a = m + "linear_attn.";
      const int64_t key_dim = int64_t(cfg.lin_k_heads) * cfg.lin_k_dim, value_dim = int64_t(cfg.lin_v_heads) * cfg.lin_v_dim;
      p.rows(a + "in_proj_qkvz.weight", qkvz_rows(f, l, cfg), H);
      p.tensor(b + "ssm_ba.weight", a + "in_proj_ba.weight", {2 * int64_t(cfg.lin_v_heads), H});
      p.tensor(b + "ssm_out.weight", a + "out_proj.weight", {H, value_dim});
      p.tensor(b + "ssm_conv1d.weight", a + "conv1d.weight", {2 * key_dim + value_dim, 1, int64_t(cfg.conv_kernel)});
      p.tensor(b + "ssm_a", a + "A", {int64_t(cfg.lin_v_heads)});  // llama.cpp stores A = −exp(A_log)
      p.tensor(b + "ssm_dt.bias", a + "dt_bias", {int64_t(cfg.lin_v_heads)});
      p.tensor(b + "ssm_norm.weight", a + "norm.weight", {int64_t(cfg.lin_v_dim)});
    }
    if (!cfg.is_moe(l)) {
      p.tensor(b + "ffn_gate.weight", m + "mlp.gate_proj.weight", {int64_t(cfg.dense_inter), H});
      p.tensor(b + "ffn_up.weight", m + "mlp.up_proj.weight", {int64_t(cfg.dense_inter), H});
      p.tensor(b + "ffn_down.weight", m + "mlp.down_proj.weight", {H, int64_t(cfg.dense_inter)});
      continue;
    }
    p.tensor(b + "ffn_gate_inp.weight", m + "mlp.gate.weight", {int64_t(cfg.n_experts), H});
    if (cfg.shared_inter > 0) {
      const int64_t S = cfg.shared_inter;
      p.tensor(b + "ffn_gate_inp_shexp.weight", m + "mlp.shared_expert_gate.weight", {1, H});
      p.tensor(b + "ffn_gate_shexp.weight", m + "mlp.shared_expert.gate_proj.weight", {S, H});
      p.tensor(b + "ffn_up_shexp.weight", m + "mlp.shared_expert.up_proj.weight", {S, H});
      p.tensor(b + "ffn_down_shexp.weight", m + "mlp.shared_expert.down_proj.weight", {H, S});
    }
  }
  return std::move(p.outs());
}

void declare(DenseOut& o, std::vector<TensorSpec>* specs) {
  o.first_spec = specs->size();
  if (o.kind != Kind::Affine) {
    specs->push_back({o.name, o.kind == Kind::NormMinusOne ? DType::F32 : o.dtype, o.shape});
    return;
  }
  const DType st = o.layout.scale_type == ScaleType::F32 ? DType::F32 : DType::F16;
  specs->push_back({o.name + ".q", DType::U8, {o.rows, o.cols * o.layout.bits / 8}});
  specs->push_back({o.name + ".scales", st, {o.rows, o.cols / o.layout.group}});
  specs->push_back({o.name + ".biases", st, {o.rows, o.cols / o.layout.group}});
}

size_t row_bytes_of(const GgufTensor& t) { return t.nbytes / size_t(t.rows()); }

// One row of a quantized GGUF tensor into `layout`'s codes, scales and biases.
void affine_row(const GgufFile& f, const GgufTensor& t, int64_t row, const GgufAffine& layout, uint8_t* codes,
                uint16_t* scales, uint16_t* biases, const std::string& name) {
  if (!gguf_row_to_affine(t.type, t.data + size_t(row) * row_bytes_of(t), int(t.row_length()), layout, codes, scales,
                          biases))
    fail("{}: tensor '{}' row {}: a block scale or bias does not fit the f16 that {} needs to stay exact", f.path(),
         t.name, row, name);
}

void write_dense(const GgufFile& f, SafetensorsWriter& w, const DenseOut& o, Progress& progress) {
  size_t done = 0;
  if (o.kind == Kind::Raw) {
    for (const Rows& r : o.parts) {
      const size_t rb = row_bytes_of(*r.t), n = size_t(r.count) * rb;
      w.write(o.first_spec, done, r.t->data + size_t(r.first) * rb, n);
      done += n;
    }
  } else if (o.kind == Kind::NormMinusOne) {
    std::vector<float> v(size_t(o.rows * o.cols));
    std::memcpy(v.data(), o.parts[0].t->data, v.size() * 4);
    for (float& x : v) x -= 1.0f;  // llama.cpp stores the zero-centred norms with the 1 added
    w.write(o.first_spec, 0, v.data(), v.size() * 4);
    done = v.size() * 4;
  } else {
    const size_t rb = size_t(o.cols) * size_t(o.layout.bits) / 8, groups = size_t(o.cols / o.layout.group);
    const size_t sb = groups * scale_size(o.layout.scale_type);
    std::vector<uint8_t> codes(rb);
    std::vector<uint16_t> scales(sb / 2), biases(sb / 2);
    int64_t out_row = 0;
    for (const Rows& r : o.parts)
      for (int64_t i = 0; i < r.count; ++i, ++out_row) {
        affine_row(f, *r.t, r.first + i, o.layout, codes.data(), scales.data(), biases.data(), o.name);
        w.write(o.first_spec, size_t(out_row) * rb, codes.data(), rb);
        w.write(o.first_spec + 1, size_t(out_row) * sb, scales.data(), sb);
        w.write(o.first_spec + 2, size_t(out_row) * sb, biases.data(), sb);
        done += row_bytes_of(*r.t);
      }
  }
  for (const Rows& r : o.parts) f.release(*r.t);
  progress.add(done);
}

// ---- experts ----

struct GgufExperts {
  ExpertLayer layout;
  std::array<const GgufTensor*, 3> src;
};

GgufExperts plan_experts(const GgufFile& f, const ModelConfig& cfg, int layer) {
  static constexpr const char* kNames[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
  const int H = cfg.hidden, I = cfg.moe_inter, E = cfg.n_experts;
  GgufExperts x;
  std::array<ProjSpec, 3> spec;
  for (size_t p = 0; p < 3; ++p) {
    const GgufTensor& t = f.tensor(fmt::format("blk.{}.{}.weight", layer, kNames[p]));
    const int rows = p == 2 ? H : I, cols = p == 2 ? I : H;
    if (t.ne.size() != 3 || t.ne[0] != cols || t.ne[1] != rows || t.ne[2] != E)
      fail("{}: tensor '{}' has shape [{}], expected [{}, {}, {}] (ggml order)", f.path(), t.name, fmt::join(t.ne, ", "),
           cols, rows, E);
    GgufAffine a;
    if (t.type == uint32_t(GgmlType::BF16)) {
      spec[p] = {kRawBits, 0, rows, cols};
    } else if (gguf_affine_layout(t.type, &a)) {
      spec[p] = {a.bits, a.group, rows, cols, a.scale_type};
    } else {
      fail("{}: tensor '{}' is {}: routed experts import from BF16 or a quantized type (the expert format holds bf16 "
           "or affine codes; llama-quantize can make Q8_0 of it)",
           f.path(), t.name, ggml_type_name(t.type));
    }
    x.src[p] = &t;
  }
  const std::string block = fmt::format("model.layers.{}.mlp", layer);
  x.layout = plan_expert_layer(block, expert_file_name(block), E, spec);
  return x;
}

void fill_record(const GgufFile& f, const GgufExperts& x, size_t e, std::vector<uint8_t>& rec) {
  for (size_t p = 0; p < 3; ++p) {
    const ProjLayout& pl = x.layout.proj[p];
    const GgufTensor& t = *x.src[p];
    const size_t rb = row_bytes_of(t), first = e * size_t(pl.rows);
    if (pl.bits == kRawBits) {
      std::memcpy(rec.data() + pl.q_offset, t.data + first * rb, size_t(pl.rows) * rb);
      continue;
    }
    const GgufAffine layout{pl.bits, pl.group, pl.scale_type};
    const size_t code_bytes = size_t(pl.cols) * size_t(pl.bits) / 8;
    const size_t scale_bytes = size_t(pl.cols / pl.group) * scale_size(pl.scale_type);
    for (int r = 0; r < pl.rows; ++r)
      affine_row(f, t, int64_t(first) + r, layout, rec.data() + pl.q_offset + size_t(r) * code_bytes,
                 reinterpret_cast<uint16_t*>(rec.data() + pl.scales_offset + size_t(r) * scale_bytes),
                 reinterpret_cast<uint16_t*>(rec.data() + pl.biases_offset + size_t(r) * scale_bytes), x.layout.name);
  }
}

Family family_of(const GgufFile& f, std::string* arch) {
  *arch = f.string("general.architecture");
  if (*arch == "qwen3moe") return Family::Qwen3Moe;
  if (*arch == "qwen3next") return Family::Qwen3Next;
  fail("{}: general.architecture '{}' is not one moestream runs (qwen3moe, qwen3next)", f.path(), *arch);
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  if (!fs::is_regular_file(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in && std::memcmp(magic, "GGUF", 4) == 0;
}

ConvertStats convert_gguf(const ConvertOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  const fs::path out(opt.out);
  const auto f = GgufFile::open(opt.from);
  std::string arch;
  const Family family = family_of(*f, &arch);
  const json config = make_config(*f, family, arch);

  TempDir tmp(out);
  write_json(tmp.path() / "config.json", config);
  const ModelConfig cfg = load_config(tmp.path().string());
  write_tokenizer(*f, tmp.path());

  std::vector<DenseOut> dense = plan_dense(*f, family, cfg);
  std::vector<TensorSpec> specs;
  for (DenseOut& o : dense) declare(o, &specs);
  std::vector<GgufExperts> experts;
  for (int l = 0; l < cfg.n_layers; ++l)
    if (cfg.is_moe(l)) experts.push_back(plan_experts(*f, cfg, l));

  ConvertStats stats;
  for (const GgufTensor& t : f->tensors()) stats.bytes_in += t.nbytes;
  Progress progress(stats.bytes_in, opt.progress);
  {
    SafetensorsWriter w((tmp.path() / kEngineDenseFile).string(), specs);
    for (const DenseOut& o : dense) write_dense(*f, w, o, progress);
    w.close();
  }
  fs::create_directory(tmp.path() / "experts");
  EngineIndex index{cfg.architecture, kRawBits, 0, {}};
  index.dense_checksums = dense_checksums((tmp.path() / kEngineDenseFile).string(), index.version);
  for (GgufExperts& x : experts) {
    write_expert_blob(
        tmp.path(), x.layout, [&](size_t e, std::vector<uint8_t>& rec, std::vector<float>&) { fill_record(*f, x, e, rec); },
        [&](size_t) {
          size_t n = 0;
          for (const GgufTensor* t : x.src) n += t->nbytes / size_t(cfg.n_experts);
          progress.add(n);
        });
    for (const GgufTensor* t : x.src) f->release(*t);
    index.layers.push_back(x.layout);
  }
  progress.finish();
  return commit_conversion(tmp, index, cfg, opt, stats, start);
}

}  // namespace ms
