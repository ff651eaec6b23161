// config.json loading: the fixtures' fields, the older public spelling giving the same config,
// and every bad input reported with the file and the field at fault.
#include "format/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "util/error.h"

namespace ms {
namespace {

using test::expect_error;

using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Writes `text` as config.json in a fresh directory; returns the file's path.
std::string write_config_text(const std::string& text) {
  std::string path = test::scratch_dir("config") + "/config.json";
  std::ofstream(path) << text;
  return path;
}
std::string write_config(const json& j) { return write_config_text(j.dump(2)); }

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.max_positions, b.max_positions);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.partial_rotary, b.partial_rotary);
  EXPECT_EQ(a.conv_kernel, b.conv_kernel);
  EXPECT_EQ(a.lin_k_heads, b.lin_k_heads);
  EXPECT_EQ(a.lin_v_heads, b.lin_v_heads);
  EXPECT_EQ(a.lin_k_dim, b.lin_k_dim);
  EXPECT_EQ(a.lin_v_dim, b.lin_v_dim);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.moe_inter, b.moe_inter);
  EXPECT_EQ(a.dense_inter, b.dense_inter);
  EXPECT_EQ(a.shared_inter, b.shared_inter);
  EXPECT_EQ(a.norm_topk, b.norm_topk);
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_EQ(a.layer_moe, b.layer_moe);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_ids, b.eos_ids);
}

constexpr auto F = LayerType::FullAttention;
constexpr auto L = LayerType::LinearAttention;

TEST(Config, Qwen3MoeFixture) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny/config.json", path);
  ModelConfig c = load_config(path);
  EXPECT_EQ(c.arch, Arch::Qwen3Moe);
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_STREQ(arch_name(c.arch), "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.hidden, 128);
  EXPECT_EQ(c.n_layers, 4);
  EXPECT_EQ(c.vocab, 1024);
  EXPECT_EQ(c.rms_eps, 1e-6f);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.max_positions, 4096);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.partial_rotary, 1.f);
  EXPECT_EQ(c.rotary_dim(), 32);
  EXPECT_EQ(c.n_experts, 32);
  EXPECT_EQ(c.top_k, 4);
  EXPECT_EQ(c.moe_inter, 64);
  EXPECT_EQ(c.dense_inter, 256);
  EXPECT_EQ(c.shared_inter, 0);
  EXPECT_TRUE(c.norm_topk);
  EXPECT_EQ(c.layer_types, std::vector<LayerType>(4, F));
  EXPECT_EQ(c.layer_moe, std::vector<bool>(4, true));
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, std::vector<int>{2});
  EXPECT_FALSE(c.zero_centred_norms());

  // A directory holding config.json loads the same.
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  expect_same(load_config(dir), c);
}

TEST(Config, Qwen3NextFixture) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", path);
  ModelConfig c = load_config(path);
  EXPECT_EQ(c.arch, Arch::Qwen3Next);
  EXPECT_EQ(c.architecture, "Qwen3NextForCausalLM");
  EXPECT_EQ(c.hidden, 128);
  EXPECT_EQ(c.n_layers, 8);
  EXPECT_EQ(c.vocab, 1024);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.partial_rotary, 0.25f);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_EQ(c.conv_kernel, 4);
  EXPECT_EQ(c.lin_k_heads, 2);
  EXPECT_EQ(c.lin_v_heads, 4);
  EXPECT_EQ(c.lin_k_dim, 32);
  EXPECT_EQ(c.lin_v_dim, 32);
  EXPECT_EQ(c.n_experts, 32);
  EXPECT_EQ(c.top_k, 4);
  EXPECT_EQ(c.moe_inter, 64);
  EXPECT_EQ(c.shared_inter, 64);
  EXPECT_EQ(c.layer_types, (std::vector<LayerType>{L, L, L, F, L, L, L, F}));
  EXPECT_EQ(c.layer_moe, std::vector<bool>(8, true));
  EXPECT_EQ(c.eos_ids, std::vector<int>{2});
  EXPECT_TRUE(c.zero_centred_norms());
}

// The spelling of public checkpoints before transformers 5: rope settings at top level,
// full_attention_interval instead of layer_types, num_experts instead of num_local_experts.
json older_spelling(json j) {
  json rp = j["rope_parameters"];
  j.erase("rope_parameters");
  j["rope_theta"] = rp["rope_theta"];
  if (rp.contains("partial_rotary_factor")) j["partial_rotary_factor"] = rp["partial_rotary_factor"];
  if (j.contains("layer_types")) {
    j.erase("layer_types");
    j["full_attention_interval"] = 4;
  }
  if (j.contains("num_local_experts")) {
    j["num_experts"] = j["num_local_experts"];
    j.erase("num_local_experts");
  }
  return j;
}

TEST(Config, OlderSpellingGivesTheSameConfig) {
  for (const char* fixture : {"qwen3-moe-tiny", "qwen3-next-tiny"}) {
    SCOPED_TRACE(fixture);
    MS_REQUIRE_SHARED(std::string("fixtures/") + fixture + "/config.json", path);
    json j = read_json(path);
    json old = older_spelling(j);
    ASSERT_NE(old, j);
    ASSERT_FALSE(old.contains("rope_parameters"));
    expect_same(load_config(write_config(old)), load_config(path));
  }
}

TEST(Config, Qwen3NextPartialRotaryOnlyInRopeParameters) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", path);
  json j = read_json(path);
  j.erase("partial_rotary_factor");
  expect_same(load_config(write_config(j)), load_config(path));
}

TEST(Config, FullAttentionIntervalAndDenseLayers) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", path);
  json j = read_json(path);
  j.erase("layer_types");
  j["full_attention_interval"] = 2;
  j["mlp_only_layers"] = {0, 5};
  ModelConfig c = load_config(write_config(j));
  EXPECT_EQ(c.layer_types, (std::vector<LayerType>{L, F, L, F, L, F, L, F}));
  EXPECT_EQ(c.layer_moe, (std::vector<bool>{false, true, true, true, true, false, true, true}));
}

// ---- bad input: ms::Error naming the file and the field ----

json fixture_json(const char* fixture) {
  std::string path = test::shared_path(std::string("fixtures/") + fixture + "/config.json");
  return path.empty() ? json() : read_json(path);
}

TEST(Config, WrongTypedFields) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", unused);
  struct Case {
    const char* field;
    json value;
  };
  const Case cases[] = {
      {"hidden_size", "128"},           {"layer_types", 3},          {"rms_norm_eps", "x"},
      {"num_hidden_layers", 8.5},       {"tie_word_embeddings", 1},  {"eos_token_id", "2"},
      {"mlp_only_layers", {"0"}},       {"rope_parameters", "x"},    {"hidden_size", 4294967424LL},  // 2^32 + 128
      {"layer_types", json::array({"full_attention"})},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.field);
    json j = fixture_json("qwen3-next-tiny");
    j[k.field] = k.value;
    std::string path = write_config(j);
    expect_error([&] { load_config(path); }, {path, std::string("'") + k.field + "'"});
  }
}

TEST(Config, WrongTypedRopeTheta) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny/config.json", unused);
  json j = fixture_json("qwen3-moe-tiny");
  j["rope_parameters"]["rope_theta"] = "1e6";
  std::string path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "rope_parameters", "'rope_theta'"});
}

TEST(Config, BadLayerTypeEntry) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", unused);
  json j = fixture_json("qwen3-next-tiny");
  j["layer_types"][2] = "sliding_attention";
  std::string path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "layer_types[2]", "sliding_attention"});
}

TEST(Config, MissingRequiredField) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny/config.json", unused);
  for (const char* field : {"hidden_size", "num_attention_heads", "vocab_size", "architectures", "moe_intermediate_size"}) {
    SCOPED_TRACE(field);
    json j = fixture_json("qwen3-moe-tiny");
    j.erase(field);
    std::string path = write_config(j);
    expect_error([&] { load_config(path); }, {path, std::string("'") + field + "'", "missing"});
  }
  json j = fixture_json("qwen3-moe-tiny");
  j.erase("num_local_experts");
  std::string path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "num_local_experts", "missing"});

  // Qwen3-Next spells it num_experts: the message names both spellings.
  json e = fixture_json("qwen3-next-tiny");
  e.erase("num_experts");
  std::string epath = write_config(e);
  expect_error([&] { load_config(epath); }, {epath, "'num_local_experts'", "'num_experts'", "missing"});

  json n = fixture_json("qwen3-next-tiny");
  n.erase("linear_key_head_dim");
  std::string npath = write_config(n);
  expect_error([&] { load_config(npath); }, {npath, "'linear_key_head_dim'", "missing"});
}

TEST(Config, InconsistentValues) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny/config.json", unused);
  json j = fixture_json("qwen3-moe-tiny");
  j["num_experts_per_tok"] = 33;
  std::string path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "num_experts_per_tok"});
  j = fixture_json("qwen3-moe-tiny");
  j["num_key_value_heads"] = 3;
  path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "num_key_value_heads"});
  j = fixture_json("qwen3-moe-tiny");
  j["hidden_size"] = 0;
  path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "'hidden_size'", "positive"});
}

TEST(Config, UnsupportedArchitecture) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny/config.json", unused);
  json j = fixture_json("qwen3-moe-tiny");
  j["architectures"] = {"LlamaForCausalLM"};
  std::string path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "LlamaForCausalLM", "not supported"});
  j["architectures"] = json::array();
  path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "'architectures'"});
}

TEST(Config, UnsupportedRopeType) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny/config.json", unused);
  json j = fixture_json("qwen3-moe-tiny");
  j["rope_parameters"]["rope_type"] = "yarn";
  std::string path = write_config(j);
  expect_error([&] { load_config(path); }, {path, "rope_type", "yarn"});
}

TEST(Config, MalformedJson) {
  std::string path = write_config_text("{\"hidden_size\": 128,");
  expect_error([&] { load_config(path); }, {path, "malformed JSON"});
  std::string arr = write_config_text("[1]");
  expect_error([&] { load_config(arr); }, {arr, "not a JSON object"});
}

TEST(Config, MissingFile) {
  std::string dir = test::scratch_dir("noconfig");
  expect_error([&] { load_config(dir); }, {dir + "/config.json", "cannot open"});
}

// ---- forged values: each runs, but computes garbage or writes out of bounds ----

struct Forged {
  const char* field;  // what the message must name
  const char* key;    // the config.json key set (a '/'-path for nested ones)
  json value;
};

// Sets `key` ("a" or "a/b") of the qwen3-next-tiny fixture's config to `value`.
json forged(const Forged& k) {
  json j = fixture_json("qwen3-next-tiny");
  const std::string key = k.key;
  if (const size_t slash = key.find('/'); slash != std::string::npos)
    j[key.substr(0, slash)][key.substr(slash + 1)] = k.value;
  else
    j[key] = k.value;
  return j;
}

TEST(Config, ForgedRopeAndNormValuesAreRefused) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", unused);
  const Forged cases[] = {
      {"partial_rotary_factor", "rope_parameters/partial_rotary_factor", 2.0},  // corrupted the heap
      {"partial_rotary_factor", "rope_parameters/partial_rotary_factor", 0.0},
      {"partial_rotary_factor", "rope_parameters/partial_rotary_factor", -0.5},
      {"partial_rotary_factor", "rope_parameters/partial_rotary_factor", 0.01},  // 32 * 0.01: no rotary pair
      {"rope_theta", "rope_parameters/rope_theta", 0.0},
      {"rope_theta", "rope_parameters/rope_theta", -10000.0},
      {"rms_norm_eps", "rms_norm_eps", 0.0},
      {"rms_norm_eps", "rms_norm_eps", -1e-6},
      {"rms_norm_eps", "rms_norm_eps", 1e300},  // float infinity
      {"rms_norm_eps", "rms_norm_eps", 2.0},
      {"head_dim", "head_dim", 33},
  };
  for (const Forged& k : cases) {
    SCOPED_TRACE(std::string(k.key) + " = " + k.value.dump());
    const std::string path = write_config(forged(k));
    expect_error([&] { load_config(path); }, {path, k.field});
  }
}

TEST(Config, ForgedSizesAndIdsAreRefused) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", unused);
  const Forged cases[] = {
      {"bos_token_id", "bos_token_id", 1024},  // vocab_size 1024
      {"bos_token_id", "bos_token_id", -2},
      {"eos_token_id", "eos_token_id", json::array({2, 5000})},
      {"eos_token_id", "eos_token_id", -1},
      {"intermediate_size", "intermediate_size", -1},
      {"shared_expert_intermediate_size", "shared_expert_intermediate_size", -64},
      {"max_position_embeddings", "max_position_embeddings", 0},
      {"decoder_sparse_step", "decoder_sparse_step", 0},
      {"mlp_only_layers", "mlp_only_layers", json::array({8})},
      {"mlp_only_layers", "mlp_only_layers", json::array({-1})},
      // Products the loader computes as int: q_proj rows, in_proj_qkvz rows.
      {"q_proj rows", "head_dim", 1 << 28},
      {"in_proj_qkvz rows", "linear_key_head_dim", 1 << 29},
      {"2 * hidden_size", "hidden_size", (1 << 30) + 1},
  };
  for (const Forged& k : cases) {
    SCOPED_TRACE(std::string(k.key) + " = " + k.value.dump());
    const std::string path = write_config(forged(k));
    expect_error([&] { load_config(path); }, {path, k.field});
  }
}

TEST(Config, DuplicateKeyAndDeepNestingAreRefused) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", unused);
  std::string text = fixture_json("qwen3-next-tiny").dump();
  text.insert(1, "\"num_hidden_layers\": 2, ");  // given twice: which one would count?
  std::string path = write_config_text(text);
  expect_error([&] { load_config(path); }, {path, "'num_hidden_layers'", "twice"});
  for (size_t depth : {300, 300000}) {
    SCOPED_TRACE(depth);
    path = write_config_text("{\"a\": " + std::string(depth, '[') + std::string(depth, ']') + "}");
    expect_error([&] { load_config(path); }, {path, "deeper than"});
  }
}

TEST(Config, MessagesQuoteAShortSummaryOfAValue) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny/config.json", unused);
  json j = fixture_json("qwen3-next-tiny");
  j["hidden_size"] = json::array();
  for (int i = 0; i < 10000; ++i) j["hidden_size"].push_back(i);
  const std::string path = write_config(j);
  try {
    load_config(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'hidden_size'"), std::string::npos) << e.what();
    EXPECT_LT(std::string(e.what()).size(), path.size() + 200) << e.what();
  }
}

}  // namespace
}  // namespace ms
