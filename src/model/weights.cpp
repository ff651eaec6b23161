#include "model/weights.h"

#include <cmath>

#include "util/error.h"

namespace ms {

namespace {

bool is_mtp(const std::string& name) { return name.rfind("mtp.", 0) == 0; }

class Loader {
 public:
  Loader(const ModelConfig& cfg, const TensorStore& store, const ExpertStore* experts, ModelWeights& w)
      : cfg_(cfg), store_(store), experts_(experts), w_(w) {}

  bool has_mat(const std::string& name) const { return store_.has(name) || store_.has(name + ".q"); }

  Mat mat(const std::string& name, int rows, int cols, bool expert = false) {
    if (store_.has(name + ".q")) return quantized_mat(name, rows, cols);
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
    if (!expert && is_mtp(name)) w_.mtp_bytes += t.nbytes;
    (expert ? w_.expert_params : w_.dense_params) += size_t(rows) * size_t(cols);
    return m;
  }

  // NAME.q U8 [rows, cols·bits/8], NAME.scales and NAME.biases [rows, cols/group] (BF16, or F16 /
  // F32 from an import): bits and group follow from the shapes, given the [rows, cols] the
  // architecture expects.
  Mat quantized_mat(const std::string& name, int rows, int cols) {
    const TensorView& q = store_.get(name + ".q");
    const TensorView& s = store_.get(name + ".scales");
    const TensorView& b = store_.get(name + ".biases");
    q.expect(DType::U8, {rows, -1});
    ScaleType scale_type = ScaleType::BF16;
    switch (s.dtype) {
      case DType::BF16: break;
      case DType::F16: scale_type = ScaleType::F16; break;
      case DType::F32: scale_type = ScaleType::F32; break;
      default: fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32", s.file, s.name, dtype_name(s.dtype));
    }
    s.expect(s.dtype, {rows, -1});
    b.expect(s.dtype, s.shape);
    const int64_t row_bytes = q.dim(1), groups = s.dim(1);
    if (row_bytes * 8 % cols != 0 || groups <= 0 || cols % groups != 0)
      fail("{}: tensor '{}.q' [{}, {}] with {} scale groups per row does not fit a [{}, {}] matrix", q.file, name, rows,
           row_bytes, groups, rows, cols);
    const QuantMat m{q.as<uint8_t>(), static_cast<const uint16_t*>(s.data), static_cast<const uint16_t*>(b.data), rows,
                     cols, int(row_bytes * 8 / cols), int(cols / groups), scale_type};
    check_quant_shape(rows, cols, m.bits, m.group, (q.file + ": " + name).c_str());
    w_.dense_bytes += q.nbytes + s.nbytes + b.nbytes;
    if (is_mtp(name)) w_.mtp_bytes += q.nbytes + s.nbytes + b.nbytes;
    w_.dense_params += size_t(rows) * size_t(cols);
    return Mat::affine(m);
  }

  // The routed experts of MoE block p as checkpoint tensors.
  std::vector<MlpWeights> experts(const std::string& p) {
    std::vector<MlpWeights> out;
    for (int e = 0; e < cfg_.n_experts; ++e) out.push_back(mlp(p + ".experts." + std::to_string(e), cfg_.moe_inter, true));
    return out;
  }

  // The routed experts of MoE block p streamed from its blob: check the record layout against
  // the config once; the matrices are made per record as experts become resident.
  void streamed_experts(const std::string& p, FfnWeights& f) {
    f.store_layer = experts_->layer_of(p);
    const ExpertLayer& layer = experts_->index().layers[size_t(f.store_layer)];
    if (layer.n_experts != cfg_.n_experts)
      fail("{}: layer {} has {} experts, the model config {}", kEngineIndexFile, p, layer.n_experts, cfg_.n_experts);
    const int H = cfg_.hidden, I = cfg_.moe_inter;
    const int want[3][2] = {{I, H}, {I, H}, {H, I}};
    for (size_t i = 0; i < 3; ++i) {
      const ProjLayout& pl = layer.proj[i];
      if (pl.rows != want[i][0] || pl.cols != want[i][1])
        fail("{}: layer {}: projection {} is [{}, {}], the model config needs [{}, {}]", kEngineIndexFile, layer.name,
             kExpertProjections[i], pl.rows, pl.cols, want[i][0], want[i][1]);
      w_.expert_bytes += size_t(layer.n_experts) * (pl.q_bytes + 2 * pl.scales_bytes);
      w_.expert_params += size_t(layer.n_experts) * size_t(pl.rows) * size_t(pl.cols);
    }
    f.record_layout = &layer;
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
    if (store_.has(p + ".A")) {
      d.A = vec(p + ".A", cfg_.lin_v_heads);
    } else {
      d.A = vec(p + ".A_log", cfg_.lin_v_heads);
      for (float& x : d.A) x = -std::exp(x);
    }
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
    if (experts_) streamed_experts(p, f);
    else f.experts = experts(p);
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
    if (!has_mat("mtp.fc.weight")) return nullptr;
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
  const ExpertStore* experts_;
  ModelWeights& w_;
};

}  // namespace

MlpWeights expert_weights(const ExpertLayer& layer, const uint8_t* record) {
  auto proj = [&](size_t i) -> Mat {
    const ProjLayout& p = layer.proj[i];
    if (p.bits == kRawBits) return {WeightType::BF16, record + p.q_offset, p.rows, p.cols};
    return Mat::affine({record + p.q_offset, reinterpret_cast<const uint16_t*>(record + p.scales_offset),
                        reinterpret_cast<const uint16_t*>(record + p.biases_offset), p.rows, p.cols, p.bits, p.group,
                        p.scale_type});
  };
  return {proj(0), proj(1), proj(2)};
}

namespace {

// A tensor of a decoder layer that config.json does not have (num_hidden_layers smaller than
// the checkpoint's) would be ignored, and the model run truncated: refuse it, naming it. A
// larger num_hidden_layers fails as a missing tensor of the first absent layer.
void check_no_extra_layers(const ModelConfig& cfg, const TensorStore& store) {
  const std::string prefix = "model.layers.";
  for (const std::string& name : store.names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t end = name.find('.', prefix.size());
    const std::string number = name.substr(prefix.size(), end == std::string::npos ? std::string::npos : end - prefix.size());
    const bool numeric = !number.empty() && number.size() <= 9 && number.find_first_not_of("0123456789") == std::string::npos;
    if (!numeric || std::stoi(number) >= cfg.n_layers)
      fail("{}: tensor '{}' belongs to no layer of the model: config.json's num_hidden_layers is {}", store.get(name).file,
           name, cfg.n_layers);
  }
}

}  // namespace

ModelWeights load_weights(const ModelConfig& cfg, const TensorStore& store, const ExpertStore* experts) {
  check_no_extra_layers(cfg, store);
  ModelWeights w;
  Loader load(cfg, store, experts, w);
  w.embed = load.mat("model.embed_tokens.weight", cfg.vocab, cfg.hidden);
  for (int l = 0; l < cfg.n_layers; ++l)
    w.layers.push_back(load.layer("model.layers." + std::to_string(l), cfg.layer_types[size_t(l)], cfg.is_moe(l)));
  w.final_norm = load.vec("model.norm.weight", cfg.hidden);
  w.lm_head = cfg.tie_embeddings && !load.has_mat("lm_head.weight") ? w.embed : load.mat("lm_head.weight", cfg.vocab, cfg.hidden);
  if (cfg.arch == Arch::Qwen3Next) w.mtp = load.mtp();
  return w;
}

}  // namespace ms
