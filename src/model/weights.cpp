#include "model/weights.h"

#include "util/error.h"

namespace ms {

namespace {

class Loader {
 public:
  Loader(const ModelConfig& cfg, const TensorStore& store, ModelWeights& w) : cfg_(cfg), store_(store), w_(w) {}

  Mat mat(const std::string& name, int rows, int cols, bool expert = false) {
    const TensorView& t = store_.get(name);
    const std::vector<int64_t> want{rows, cols};
    Mat m{WeightType::F32, t.data, rows, cols};
    switch (t.dtype) {
      case DType::BF16: t.expect(DType::BF16, want); m.type = WeightType::BF16; break;
      case DType::F32: t.expect(DType::F32, want); break;
      case DType::F16:
        t.expect(DType::F16, want);
        m.data = w_.owned.emplace_back(t.to_f32()).data();
        break;
      default:
        fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32", t.file, name, dtype_name(t.dtype));
    }
    (expert ? w_.expert_bytes : w_.dense_bytes) += t.nbytes;
    (expert ? w_.expert_params : w_.dense_params) += size_t(rows) * size_t(cols);
    return m;
  }

  std::vector<float> vec(const std::string& name, std::vector<int64_t> shape) {
    const TensorView& t = store_.get(name);
    if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32)
      fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32", t.file, name, dtype_name(t.dtype));
    t.expect(t.dtype, shape);
    w_.dense_bytes += t.nbytes;
    w_.dense_params += size_t(t.numel());
    return t.to_f32();
  }
  std::vector<float> vec(const std::string& name, int64_t n) { return vec(name, std::vector<int64_t>{n}); }

  MlpWeights mlp(const std::string& p, int inter, bool expert = false) {
    return {mat(p + ".gate_proj.weight", inter, cfg_.hidden, expert), mat(p + ".up_proj.weight", inter, cfg_.hidden, expert),
            mat(p + ".down_proj.weight", cfg_.hidden, inter, expert)};
  }

  AttentionWeights attention(const std::string& p) {
    const int H = cfg_.hidden, hd = cfg_.head_dim;
    const int q_rows = cfg_.n_heads * hd * (cfg_.arch == Arch::Qwen3Next ? 2 : 1);
    return {mat(p + ".q_proj.weight", q_rows, H), mat(p + ".k_proj.weight", cfg_.n_kv_heads * hd, H),
            mat(p + ".v_proj.weight", cfg_.n_kv_heads * hd, H), mat(p + ".o_proj.weight", H, cfg_.n_heads * hd),
            vec(p + ".q_norm.weight", hd), vec(p + ".k_norm.weight", hd)};
  }

  DeltaNetWeights deltanet(const std::string& p) {
    const int H = cfg_.hidden;
    const int key_dim = cfg_.lin_k_heads * cfg_.lin_k_dim, value_dim = cfg_.lin_v_heads * cfg_.lin_v_dim;
    const int conv_dim = 2 * key_dim + value_dim;
    DeltaNetWeights d;
    d.in_proj_qkvz = mat(p + ".in_proj_qkvz.weight", 2 * key_dim + 2 * value_dim, H);
    d.in_proj_ba = mat(p + ".in_proj_ba.weight", 2 * cfg_.lin_v_heads, H);
    d.out_proj = mat(p + ".out_proj.weight", H, value_dim);
    d.conv1d = vec(p + ".conv1d.weight", {conv_dim, 1, cfg_.conv_kernel});
    d.A_log = vec(p + ".A_log", cfg_.lin_v_heads);
    d.dt_bias = vec(p + ".dt_bias", cfg_.lin_v_heads);
    d.norm = vec(p + ".norm.weight", cfg_.lin_v_dim);
    return d;
  }

  FfnWeights ffn(const std::string& p, bool moe) {
    FfnWeights f;
    if (!moe) {
      f.dense = mlp(p, cfg_.dense_inter);
      return f;
    }
    f.router = mat(p + ".gate.weight", cfg_.n_experts, cfg_.hidden);
    for (int e = 0; e < cfg_.n_experts; ++e) f.experts.push_back(mlp(p + ".experts." + std::to_string(e), cfg_.moe_inter, true));
    if (cfg_.shared_inter > 0) {
      f.shared_expert = mlp(p + ".shared_expert", cfg_.shared_inter);
      f.shared_expert_gate = mat(p + ".shared_expert_gate.weight", 1, cfg_.hidden);
    }
    return f;
  }

  LayerWeights layer(const std::string& p, LayerType type, bool moe) {
    LayerWeights l;
    l.type = type;
    l.moe = moe;
    l.input_norm = vec(p + ".input_layernorm.weight", cfg_.hidden);
    l.post_attention_norm = vec(p + ".post_attention_layernorm.weight", cfg_.hidden);
    if (type == LayerType::FullAttention) l.attn = attention(p + ".self_attn");
    else l.linear = deltanet(p + ".linear_attn");
    l.ffn = ffn(p + ".mlp", moe);
    return l;
  }

  std::unique_ptr<MtpWeights> mtp() {
    if (!store_.has("mtp.fc.weight")) return nullptr;
    auto m = std::make_unique<MtpWeights>();
    m->fc = mat("mtp.fc.weight", cfg_.hidden, 2 * cfg_.hidden);
    m->pre_fc_norm_embedding = vec("mtp.pre_fc_norm_embedding.weight", cfg_.hidden);
    m->pre_fc_norm_hidden = vec("mtp.pre_fc_norm_hidden.weight", cfg_.hidden);
    m->norm = vec("mtp.norm.weight", cfg_.hidden);
    m->layer = layer("mtp.layers.0", LayerType::FullAttention, true);
    return m;
  }

 private:
  const ModelConfig& cfg_;
  const TensorStore& store_;
  ModelWeights& w_;
};

}  // namespace

ModelWeights load_weights(const ModelConfig& cfg, const TensorStore& store) {
  ModelWeights w;
  Loader load(cfg, store, w);
  w.embed = load.mat("model.embed_tokens.weight", cfg.vocab, cfg.hidden);
  for (int l = 0; l < cfg.n_layers; ++l)
    w.layers.push_back(load.layer("model.layers." + std::to_string(l), cfg.layer_types[size_t(l)], cfg.is_moe(l)));
  w.final_norm = load.vec("model.norm.weight", cfg.hidden);
  w.lm_head = cfg.tie_embeddings && !store.has("lm_head.weight") ? w.embed : load.mat("lm_head.weight", cfg.vocab, cfg.hidden);
  if (cfg.arch == Arch::Qwen3Next) w.mtp = load.mtp();
  return w;
}

}  // namespace ms
