#include "writers/synth.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "format/config.h"
#include "format/engine_dir.h"
#include "format/safetensors.h"
#include "util/error.h"
#include "util/half.h"
#include "writers/engine_writer.h"

namespace ms {

namespace fs = std::filesystem;

namespace {

// ---- values ----

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The random stream of one tensor: a function of the seed and its name only, so the values do
// not depend on the order or the pieces they are generated in.
uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(seed ^ mix64(h));
}

// Element i of a stream, uniform in [-1, 1): two elements per 64-bit draw.
float uniform_at(uint64_t key, size_t i) {
  const uint64_t r = mix64(key + (i >> 1));
  const uint32_t h = (i & 1) ? uint32_t(r >> 32) : uint32_t(r);
  return float(h) * 0x1p-31f - 1.0f;
}

// How a tensor's values are drawn: center + amp·U(-1, 1), or A_log's log U(1, 16).
struct Init {
  float center = 0, amp = 0;
  bool log_uniform = false;
};

constexpr float kMatrixStd = 0.02f;
const float kMatrixAmp = kMatrixStd * std::sqrt(3.0f);  // U(-a, a) has std a/√3

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Matrices std 0.02 keep every projection's output at about its input's scale (2048·0.02² ≈
// 0.8). Qwen3-Next's RMSNorms are zero-centred (the scale is 1 + w), so their weights are
// near 0; the DeltaNet output norm is plain (near 1). conv1d as PyTorch's default init
// (U(±1/√kernel)), A_log and dt_bias as Qwen3-Next's.
Init init_for(const std::string& name, int conv_kernel) {
  if (ends_with(name, "linear_attn.norm.weight")) return {1.0f, kMatrixAmp};
  if (ends_with(name, "norm.weight")) return {0.0f, kMatrixAmp};
  if (ends_with(name, "conv1d.weight")) return {0.0f, 1.0f / std::sqrt(float(conv_kernel))};
  if (ends_with(name, ".A_log")) return {0, 0, true};
  if (ends_with(name, ".dt_bias")) return {1.0f, 0.0f};
  return {0.0f, kMatrixAmp};
}

void fill_values(uint64_t key, const Init& init, size_t first, size_t n, float* out) {
  for (size_t j = 0; j < n; ++j) {
    const float u = uniform_at(key, first + j);
    out[j] = init.log_uniform ? std::log(1.0f + 7.5f * (u + 1.0f)) : init.center + init.amp * u;
  }
}

// ---- the model's tensors ----

struct DenseTensor {
  std::string name;
  std::vector<int64_t> shape;
  int bits = kRawBits, group = 0;
  size_t first_spec = 0;

  size_t numel() const {
    size_t n = 1;
    for (auto d : shape) n *= size_t(d);
    return n;
  }
};

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l); }
const char* kMtpLayer = "mtp.layers.0";

bool is_full_attention(const SynthShape& s, int l) { return (l + 1) % s.full_attention_interval == 0; }

// A decoder layer's non-expert tensors (prefix "model.layers.N" or "mtp.layers.0").
void layer_tensors(const SynthShape& s, const std::string& p, bool full_attention, std::vector<DenseTensor>& t) {
  const int64_t H = s.hidden, hd = s.head_dim;
  const int64_t key_dim = int64_t(s.lin_k_heads) * s.lin_k_dim, value_dim = int64_t(s.lin_v_heads) * s.lin_v_dim;
  {
    t.push_back({p + ".input_layernorm.weight", {H}});
    t.push_back({p + ".post_attention_layernorm.weight", {H}});
    if (full_attention) {
      const std::string a = p + ".self_attn";
      t.push_back({a + ".q_proj.weight", {2 * s.n_heads * hd, H}});  // query and gate per head
      t.push_back({a + ".k_proj.weight", {s.n_kv_heads * hd, H}});
      t.push_back({a + ".v_proj.weight", {s.n_kv_heads * hd, H}});
      t.push_back({a + ".o_proj.weight", {H, s.n_heads * hd}});
      t.push_back({a + ".q_norm.weight", {hd}});
      t.push_back({a + ".k_norm.weight", {hd}});
    } else {
      const std::string a = p + ".linear_attn";
      t.push_back({a + ".in_proj_qkvz.weight", {2 * key_dim + 2 * value_dim, H}});
      t.push_back({a + ".in_proj_ba.weight", {2 * s.lin_v_heads, H}});
      t.push_back({a + ".out_proj.weight", {H, value_dim}});
      t.push_back({a + ".conv1d.weight", {2 * key_dim + value_dim, 1, s.conv_kernel}});
      t.push_back({a + ".A_log", {s.lin_v_heads}});
      t.push_back({a + ".dt_bias", {s.lin_v_heads}});
      t.push_back({a + ".norm.weight", {s.lin_v_dim}});
    }
    const std::string m = p + ".mlp";
    t.push_back({m + ".gate.weight", {s.n_experts, H}});
    t.push_back({m + ".shared_expert.gate_proj.weight", {s.shared_inter, H}});
    t.push_back({m + ".shared_expert.up_proj.weight", {s.shared_inter, H}});
    t.push_back({m + ".shared_expert.down_proj.weight", {H, s.shared_inter}});
    t.push_back({m + ".shared_expert_gate.weight", {1, H}});
  }
}

// Every non-expert tensor of the model, with the shapes model/weights.cpp expects; the MTP
// head's where mtp.
std::vector<DenseTensor> dense_tensors(const SynthShape& s, bool mtp) {
  const int64_t H = s.hidden, V = s.vocab;
  std::vector<DenseTensor> t = {{"model.embed_tokens.weight", {V, H}}, {"model.norm.weight", {H}}, {"lm_head.weight", {V, H}}};
  for (int l = 0; l < s.layers; ++l) layer_tensors(s, layer_prefix(l), is_full_attention(s, l), t);
  if (mtp) {
    for (const char* n : {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"})
      t.push_back({n, {H}});
    t.push_back({"mtp.fc.weight", {H, 2 * H}});
    layer_tensors(s, kMtpLayer, true, t);
  }
  return t;
}

std::vector<DenseTensor> plan_dense(const SynthOptions& opt, std::vector<TensorSpec>* specs) {
  std::vector<DenseTensor> dense = dense_tensors(opt.shape, opt.mtp);
  for (auto& t : dense) {
    t.bits = dense_bits_for(t.name, t.shape, true, opt.dense_bits, opt.dense_group);
    t.group = opt.dense_group;
    t.first_spec = add_dense_specs(t.name, DType::BF16, t.shape, t.bits, t.group, specs);
  }
  return dense;
}

std::vector<ExpertLayer> plan_experts(const SynthOptions& opt) {
  const SynthShape& s = opt.shape;
  std::array<ProjSpec, 3> spec;
  for (size_t p = 0; p < 3; ++p)
    spec[p] = {opt.expert_bits, opt.expert_group, p == 2 ? s.hidden : s.moe_inter,
               p == 2 ? s.moe_inter : s.hidden};
  std::vector<ExpertLayer> layers;
  std::vector<std::string> blocks;
  for (int l = 0; l < s.layers; ++l) blocks.push_back(layer_prefix(l) + ".mlp");
  if (opt.mtp) blocks.push_back(std::string(kMtpLayer) + ".mlp");
  for (const std::string& block : blocks) layers.push_back(plan_expert_layer(block, expert_file_name(block), s.n_experts, spec));
  return layers;
}

nlohmann::ordered_json config_json(const SynthShape& s) {
  nlohmann::ordered_json c;
  c["architectures"] = {"Qwen3NextForCausalLM"};
  c["model_type"] = "qwen3_next";
  c["hidden_size"] = s.hidden;
  c["num_hidden_layers"] = s.layers;
  c["vocab_size"] = s.vocab;
  c["num_attention_heads"] = s.n_heads;
  c["num_key_value_heads"] = s.n_kv_heads;
  c["head_dim"] = s.head_dim;
  c["full_attention_interval"] = s.full_attention_interval;
  c["linear_conv_kernel_dim"] = s.conv_kernel;
  c["linear_key_head_dim"] = s.lin_k_dim;
  c["linear_num_key_heads"] = s.lin_k_heads;
  c["linear_num_value_heads"] = s.lin_v_heads;
  c["linear_value_head_dim"] = s.lin_v_dim;
  c["num_experts"] = s.n_experts;
  c["num_experts_per_tok"] = s.top_k;
  c["moe_intermediate_size"] = s.moe_inter;
  c["shared_expert_intermediate_size"] = s.shared_inter;
  c["intermediate_size"] = s.dense_inter;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = nlohmann::ordered_json::array();
  c["norm_topk_prob"] = true;
  c["hidden_act"] = "silu";
  c["rms_norm_eps"] = 1e-6;
  c["rope_theta"] = 10000000.0;
  c["partial_rotary_factor"] = 0.25;
  c["max_position_embeddings"] = 262144;
  c["tie_word_embeddings"] = false;
  c["bos_token_id"] = s.bos_id;
  c["eos_token_id"] = s.eos_id;
  return c;
}

// ---- writing ----

void write_dense(SafetensorsWriter& w, const DenseTensor& t, uint64_t seed, int conv_kernel, Progress& progress) {
  const uint64_t key = tensor_key(seed, t.name);
  const Init init = init_for(t.name, conv_kernel);
  const size_t n = t.numel();
  std::vector<float> f;
  if (t.bits == kRawBits) {
    std::vector<uint16_t> b;
    for (size_t first = 0; first < n; first += kDenseChunkValues) {
      const size_t k = std::min(kDenseChunkValues, n - first);
      f.resize(k), b.resize(k);
      fill_values(key, init, first, k, f.data());
      for (size_t i = 0; i < k; ++i) b[i] = f32_to_bf16(f[i]);
      w.write(t.first_spec, first * 2, b.data(), k * 2);
    }
  } else {
    const size_t rows = size_t(t.shape[0]), cols = size_t(t.shape[1]);
    const size_t rows_per_piece = dense_rows_per_piece(cols);
    for (size_t r0 = 0; r0 < rows; r0 += rows_per_piece) {
      const size_t k = std::min(rows_per_piece, rows - r0);
      f.resize(k * cols);
      fill_values(key, init, r0 * cols, k * cols, f.data());
      write_quantized_rows(w, t.first_spec, r0, f.data(), int(k), int(cols), t.bits, t.group, "synthetic tensor '" + t.name + "'");
    }
  }
  progress.add(n * 2);
}

void fill_expert(const ExpertLayer& layout, uint64_t seed, size_t e, std::vector<uint8_t>& rec, std::vector<float>& f) {
  for (size_t p = 0; p < 3; ++p) {
    const ProjLayout& pl = layout.proj[p];
    const std::string name = fmt::format("{}.experts.{}.{}_proj.weight", layout.name, e, kExpertProjections[p]);
    f.resize(size_t(pl.rows) * size_t(pl.cols));
    fill_values(tensor_key(seed, name), Init{0.0f, kMatrixAmp}, 0, f.size(), f.data());
    put_projection(pl, f.data(), rec.data(), "synthetic tensor '" + name + "'");
  }
}

void check_options(const SynthOptions& opt) {
  if (opt.out.empty()) fail("--out: an output directory is required");
  check_bits("--expert-bits", opt.expert_bits, {2, 3, 4, 8, 16});
  check_bits("--expert-group", opt.expert_group, {32, 64, 128});
  check_bits("--dense-bits", opt.dense_bits, {4, 8, 16});
  check_bits("--dense-group", opt.dense_group, {32, 64, 128});
  if (opt.shape.layers <= 0) fail("--layers: must be positive, is {}", opt.shape.layers);
}

// Fails unless the filesystem that will hold `out` has `need` bytes free.
void check_free_space(const fs::path& out, size_t need) {
  const fs::path parent = fs::absolute(out).parent_path();
  struct statvfs st {};
  if (statvfs(parent.c_str(), &st) != 0) fail("{}: cannot query free space: {}", parent.string(), std::strerror(errno));
  const size_t avail = size_t(st.f_bavail) * size_t(st.f_frsize);
  if (need > avail)
    fail("{}: the synthetic model needs {:.2f} GB but {} has only {:.2f} GB free (use fewer --layers or fewer --expert-bits)",
         out.string(), double(need) / 1e9, parent.string(), double(avail) / 1e9);
}

}  // namespace

SynthShape synth_shape(const std::string& like) {
  SynthShape s;
  if (like == "80b-a3b") {  // Qwen/Qwen3-Next-80B-A3B's config.json
    s.hidden = 2048, s.vocab = 151936, s.layers = 48;
    s.n_heads = 16, s.n_kv_heads = 2, s.head_dim = 256;
    s.lin_k_heads = 16, s.lin_v_heads = 32, s.lin_k_dim = 128, s.lin_v_dim = 128, s.conv_kernel = 4;
    s.n_experts = 512, s.top_k = 10, s.moe_inter = 512, s.shared_inter = 512, s.dense_inter = 5120;
    s.bos_id = 151643, s.eos_id = 151645;
  } else if (like == "tiny") {
    s.hidden = 128, s.vocab = 512, s.layers = 4;
    s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 32;
    s.lin_k_heads = 2, s.lin_v_heads = 4, s.lin_k_dim = 32, s.lin_v_dim = 32, s.conv_kernel = 4;
    s.n_experts = 32, s.top_k = 4, s.moe_inter = 64, s.shared_inter = 64, s.dense_inter = 256;
    s.bos_id = 0, s.eos_id = 1;
  } else {
    fail("--like: '{}' is not a known shape (80b-a3b, tiny)", like);
  }
  return s;
}

size_t synth_bytes(const SynthOptions& opt) {
  std::vector<TensorSpec> specs;
  plan_dense(opt, &specs);
  size_t bytes = 0;
  for (auto& s : specs) bytes += s.nbytes();
  for (auto& l : plan_experts(opt)) bytes += size_t(l.n_experts) * l.stride;
  return bytes;
}

SynthStats synth_model(const SynthOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  check_options(opt);
  const fs::path out(opt.out);
  if (fs::exists(out) && !opt.force) fail("{}: already exists (use --force to replace it)", opt.out);
  std::vector<TensorSpec> specs;
  const std::vector<DenseTensor> dense = plan_dense(opt, &specs);
  std::vector<ExpertLayer> experts = plan_experts(opt);
  const size_t bytes = synth_bytes(opt);
  check_free_space(out, bytes + (size_t(64) << 20));

  TempDir tmp(out);
  write_text_file(tmp.path() / "config.json", config_json(opt.shape).dump(2) + "\n");
  const ModelConfig cfg = load_config(tmp.path().string());
  size_t values = 0;  // progress counts weights as bf16 bytes
  for (auto& t : dense) values += t.numel();
  for (auto& l : experts)
    for (auto& p : l.proj) values += size_t(l.n_experts) * size_t(p.rows) * size_t(p.cols);
  Progress progress(values * 2, opt.progress);
  {
    SafetensorsWriter w((tmp.path() / kEngineDenseFile).string(), specs);
    for (auto& t : dense) write_dense(w, t, opt.seed, opt.shape.conv_kernel, progress);
    w.close();
  }
  fs::create_directory(tmp.path() / "experts");
  const size_t expert_values = 3 * size_t(opt.shape.hidden) * size_t(opt.shape.moe_inter);
  for (auto& layout : experts)
    write_expert_blob(
        tmp.path(), layout,
        [&](size_t e, std::vector<uint8_t>& rec, std::vector<float>& f) { fill_expert(layout, opt.seed, e, rec, f); },
        [&](size_t) { progress.add(expert_values * 2); });
  progress.finish();
  EngineIndex index{cfg.architecture, opt.dense_bits, opt.dense_bits == kRawBits ? 0 : opt.dense_group, experts};
  index.dense_checksums = dense_checksums((tmp.path() / kEngineDenseFile).string(), index.version);
  // The index last: a directory holding moestream.json holds everything it names.
  write_text_file(tmp.path() / kEngineIndexFile, engine_index_json(index, cfg));
  SynthStats stats;
  for (auto& e : fs::recursive_directory_iterator(tmp.path()))
    if (e.is_regular_file()) stats.bytes_out += e.file_size();
  tmp.commit(out, opt.force);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace ms
