#include "format/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>

#include "util/error.h"
#include "util/json.h"

namespace ms {

using json = nlohmann::json;

const char* arch_name(Arch a) { return a == Arch::Qwen3Moe ? "Qwen3MoeForCausalLM" : "Qwen3NextForCausalLM"; }

namespace {

// An integer that get<int>() returns unchanged (no silent wrap-around of large values).
bool is_int(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(INT32_MAX);
  return v.is_number_integer() && v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
}

// Typed field access that names the file and field on any mismatch.
class Fields {
 public:
  Fields(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int integer(const char* key) const {
    const json& v = need(key);
    if (!is_int(v)) wrong(key, v, "a 32-bit integer");
    return v.get<int>();
  }
  int integer(const char* key, int dflt) const { return has(key) ? integer(key) : dflt; }

  double number(const char* key) const {
    const json& v = need(key);
    if (!v.is_number()) wrong(key, v, "a number");
    return v.get<double>();
  }
  double number(const char* key, double dflt) const { return has(key) ? number(key) : dflt; }

  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_[key];
    if (!v.is_boolean()) wrong(key, v, "true or false");
    return v.get<bool>();
  }

  const json& need(const char* key) const {
    if (!has(key)) fail("{}: required field '{}' is missing", path_, key);
    return j_[key];
  }

  [[noreturn]] void wrong(const std::string& key, const json& v, const char* expected) const {
    fail("{}: field '{}' is {}, expected {}", path_, key, json_summary(v), expected);
  }

  const std::string& path() const { return path_; }
  const json& raw() const { return j_; }

 private:
  const json& j_;
  std::string path_;
};

std::vector<int> int_list(const Fields& f, const char* key) {
  std::vector<int> r;
  if (!f.has(key)) return r;
  const json& v = f.raw()[key];
  if (is_int(v)) return {v.get<int>()};
  if (!v.is_array()) f.wrong(key, v, "an integer or a list of integers");
  for (auto& e : v) {
    if (!is_int(e)) f.wrong(key, v, "a list of integers");
    r.push_back(e.get<int>());
  }
  return r;
}

void read_rope(const Fields& f, ModelConfig& c) {
  c.rope_theta = f.number("rope_theta", 10000.0);
  c.partial_rotary = float(f.number("partial_rotary_factor", 1.0));
  if (f.has("rope_parameters")) {
    const json& rp = f.raw()["rope_parameters"];
    if (!rp.is_object()) f.wrong("rope_parameters", rp, "an object");
    Fields r(rp, f.path() + " (rope_parameters)");
    c.rope_theta = r.number("rope_theta", c.rope_theta);
    c.partial_rotary = float(r.number("partial_rotary_factor", c.partial_rotary));
    if (r.has("rope_type")) {
      const json& t = rp["rope_type"];
      if (!t.is_string() || t.get<std::string>() != "default")
        fail("{}: rope_parameters.rope_type {} is not supported (only \"default\")", f.path(), json_summary(t));
    }
  }
}

void read_layer_types(const Fields& f, ModelConfig& c) {
  c.layer_types.assign(size_t(c.n_layers), LayerType::FullAttention);
  if (c.arch != Arch::Qwen3Next) return;
  if (f.has("layer_types")) {
    const json& lt = f.raw()["layer_types"];
    if (!lt.is_array() || lt.size() != size_t(c.n_layers))
      f.wrong("layer_types", lt, fmt::format("a list of {} layer types", c.n_layers).c_str());
    for (size_t i = 0; i < lt.size(); ++i) {
      std::string s = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (s == "full_attention") c.layer_types[i] = LayerType::FullAttention;
      else if (s == "linear_attention") c.layer_types[i] = LayerType::LinearAttention;
      else fail("{}: layer_types[{}] is {}, expected \"full_attention\" or \"linear_attention\"", f.path(), i, json_summary(lt[i]));
    }
  } else {
    int interval = f.integer("full_attention_interval", 4);
    if (interval <= 0) fail("{}: full_attention_interval must be positive, is {}", f.path(), interval);
    for (int i = 0; i < c.n_layers; ++i)
      c.layer_types[size_t(i)] = (i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::LinearAttention;
  }
}

void check_positive(const std::string& path, const char* what, int v) {
  if (v <= 0) fail("{}: field '{}' must be positive, is {}", path, what, v);
}

void check_non_negative(const std::string& path, const char* what, int v) {
  if (v < 0) fail("{}: field '{}' must be 0 or positive, is {}", path, what, v);
}

// Row counts the loader computes as int (e.g. q_proj's num_attention_heads * head_dim * 2):
// a product that does not fit is refused here rather than wrapping around there.
void check_product(const std::string& path, const char* what, int64_t v) {
  if (v > INT32_MAX) fail("{}: {} is {}, more than a tensor dimension can be (2^31 - 1)", path, what, v);
}

// rope_theta, partial_rotary_factor and rms_norm_eps drive the arithmetic of every layer: a
// value outside their range runs, but computes garbage (or, for the rotary dim, writes past a head).
void check_rope_and_norm(const std::string& path, const ModelConfig& c) {
  if (!std::isfinite(c.rope_theta) || c.rope_theta <= 0)
    fail("{}: field 'rope_theta' must be a finite positive number, is {}", path, c.rope_theta);
  if (!std::isfinite(c.partial_rotary) || c.partial_rotary <= 0 || c.partial_rotary > 1)
    fail("{}: field 'partial_rotary_factor' must be in (0, 1], is {}", path, c.partial_rotary);
  if (c.head_dim % 2 != 0) fail("{}: field 'head_dim' must be even (rotary pairs), is {}", path, c.head_dim);
  if (c.rotary_dim() <= 0)
    fail("{}: partial_rotary_factor {} of head_dim {} leaves no rotary dimension pair", path, c.partial_rotary, c.head_dim);
  if (!std::isfinite(c.rms_eps) || c.rms_eps <= 0 || c.rms_eps >= 1)
    fail("{}: field 'rms_norm_eps' must be in (0, 1), is {}", path, c.rms_eps);
}

void check_token_ids(const std::string& path, const ModelConfig& c) {
  if (c.bos_id != -1 && (c.bos_id < 0 || c.bos_id >= c.vocab))
    fail("{}: field 'bos_token_id' {} is outside the vocabulary [0, {})", path, c.bos_id, c.vocab);
  for (int id : c.eos_ids)
    if (id < 0 || id >= c.vocab) fail("{}: field 'eos_token_id' {} is outside the vocabulary [0, {})", path, id, c.vocab);
}

void check_layer_lists(const std::string& path, const ModelConfig& c, const std::vector<int>& mlp_only) {
  for (int l : mlp_only)
    if (l < 0 || l >= c.n_layers)
      fail("{}: field 'mlp_only_layers' names layer {}, outside [0, {}) (num_hidden_layers)", path, l, c.n_layers);
}

void check_products(const std::string& path, const ModelConfig& c) {
  const int64_t q_rows = int64_t(c.n_heads) * c.head_dim * (c.arch == Arch::Qwen3Next ? 2 : 1);
  check_product(path, "num_attention_heads * head_dim (q_proj rows)", q_rows);
  check_product(path, "num_key_value_heads * head_dim", int64_t(c.n_kv_heads) * c.head_dim);
  check_product(path, "2 * hidden_size", 2 * int64_t(c.hidden));
  const int64_t key_dim = int64_t(c.lin_k_heads) * c.lin_k_dim, value_dim = int64_t(c.lin_v_heads) * c.lin_v_dim;
  check_product(path, "2 * linear key dim + 2 * linear value dim (in_proj_qkvz rows)", 2 * key_dim + 2 * value_dim);
}

}  // namespace

ModelConfig load_config(const std::string& where) {
  namespace fs = std::filesystem;
  std::string path = fs::is_directory(where) ? (fs::path(where) / "config.json").string() : where;
  const json j = parse_json_file(path, {.reject_duplicate_keys = true});
  if (!j.is_object()) fail("{}: not a JSON object", path);
  Fields f(j, path);
  ModelConfig c;

  const json& archs = f.need("architectures");
  if (!archs.is_array() || archs.empty() || !archs[0].is_string()) f.wrong("architectures", archs, "a list of names");
  c.architecture = archs[0].get<std::string>();
  if (c.architecture == "Qwen3MoeForCausalLM") c.arch = Arch::Qwen3Moe;
  else if (c.architecture == "Qwen3NextForCausalLM") c.arch = Arch::Qwen3Next;
  else fail("{}: architecture '{}' is not supported (supported: Qwen3MoeForCausalLM, Qwen3NextForCausalLM)", path,
            c.architecture.substr(0, 80));

  c.hidden = f.integer("hidden_size");
  c.n_layers = f.integer("num_hidden_layers");
  c.vocab = f.integer("vocab_size");
  c.rms_eps = float(f.number("rms_norm_eps", 1e-6));
  c.tie_embeddings = f.boolean("tie_word_embeddings", false);
  c.max_positions = f.integer("max_position_embeddings", 32768);
  c.n_heads = f.integer("num_attention_heads");
  c.n_kv_heads = f.integer("num_key_value_heads", c.n_heads);
  c.head_dim = f.integer("head_dim", c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  read_rope(f, c);

  if (!f.has("num_experts") && !f.has("num_local_experts"))
    fail("{}: required field 'num_local_experts' (or 'num_experts') is missing", path);
  c.n_experts = f.has("num_experts") ? f.integer("num_experts") : f.integer("num_local_experts");
  c.top_k = f.integer("num_experts_per_tok");
  c.moe_inter = f.integer("moe_intermediate_size");
  c.dense_inter = f.integer("intermediate_size", 0);
  c.shared_inter = f.integer("shared_expert_intermediate_size", 0);
  c.norm_topk = f.boolean("norm_topk_prob", true);

  for (auto [name, v] : {std::pair{"hidden_size", c.hidden}, {"num_hidden_layers", c.n_layers}, {"vocab_size", c.vocab},
                         {"num_attention_heads", c.n_heads}, {"num_key_value_heads", c.n_kv_heads},
                         {"head_dim", c.head_dim}, {"num_experts", c.n_experts}, {"num_experts_per_tok", c.top_k},
                         {"moe_intermediate_size", c.moe_inter}, {"max_position_embeddings", c.max_positions}})
    check_positive(path, name, v);
  check_non_negative(path, "intermediate_size", c.dense_inter);
  check_non_negative(path, "shared_expert_intermediate_size", c.shared_inter);
  if (c.top_k > c.n_experts) fail("{}: num_experts_per_tok {} exceeds num_experts {}", path, c.top_k, c.n_experts);
  if (c.n_heads % c.n_kv_heads != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", path, c.n_heads, c.n_kv_heads);
  check_rope_and_norm(path, c);

  if (c.arch == Arch::Qwen3Next) {
    c.conv_kernel = f.integer("linear_conv_kernel_dim");
    c.lin_k_heads = f.integer("linear_num_key_heads");
    c.lin_v_heads = f.integer("linear_num_value_heads");
    c.lin_k_dim = f.integer("linear_key_head_dim");
    c.lin_v_dim = f.integer("linear_value_head_dim");
    for (auto [name, v] : {std::pair{"linear_conv_kernel_dim", c.conv_kernel}, {"linear_num_key_heads", c.lin_k_heads},
                           {"linear_num_value_heads", c.lin_v_heads}, {"linear_key_head_dim", c.lin_k_dim},
                           {"linear_value_head_dim", c.lin_v_dim}})
      check_positive(path, name, v);
    if (c.lin_v_heads % c.lin_k_heads != 0)
      fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", path, c.lin_v_heads,
           c.lin_k_heads);
  }
  check_products(path, c);
  read_layer_types(f, c);

  std::vector<int> mlp_only = int_list(f, "mlp_only_layers");
  check_layer_lists(path, c, mlp_only);
  int step = f.integer("decoder_sparse_step", 1);
  if (step <= 0) fail("{}: field 'decoder_sparse_step' must be positive, is {}", path, step);
  c.layer_moe.resize(size_t(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    bool dense = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end() || (i + 1) % step != 0;
    c.layer_moe[size_t(i)] = !dense;
    if (dense) check_positive(path, "intermediate_size", c.dense_inter);
  }

  std::vector<int> bos = int_list(f, "bos_token_id");
  c.bos_id = bos.empty() ? -1 : bos[0];
  c.eos_ids = int_list(f, "eos_token_id");
  check_token_ids(path, c);
  return c;
}

}  // namespace ms
