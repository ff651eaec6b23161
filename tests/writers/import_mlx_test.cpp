// convert --from MLX_DIR: MLX-layout checkpoints written by tests/data/mlx/make_checkpoint.py
// (numpy, from mlx-lm's public format) import losslessly: the engine directory gives the logits
// of the Hugging Face checkpoint of the dequantized weights, and holds the very codes, scales and
// biases of the source.
#include "writers/import_mlx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/load.h"
#include "format/engine_dir.h"
#include "model/model.h"
#include "model/weights.h"
#include "quant/affine.h"
#include "test_support.h"
#include "writers/import_support.h"
#include "util/error.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace ms {
namespace {

namespace fs = std::filesystem;

std::string import(const std::string& from, const std::string& tag, ConvertOptions opt = {}) {
  opt.from = from;
  opt.out = test::scratch_dir(tag) + "/model";
  convert_checkpoint(opt);
  return opt.out;
}

using Case = std::pair<const char*, const char*>;  // fixture, generator case

class MlxImport : public ::testing::TestWithParam<Case> {};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = std::string(info.param.first) + "_" + info.param.second;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

// Every position's logits of the three reference prompts, against the Hugging Face path on the
// dequantized weights (scale·q + bias in float32), within test::logit_bound; the weights
// themselves are the same bits (DequantizedWeightsAreTheReferenceBits).
TEST_P(MlxImport, LogitsMatchTheDequantizedCheckpoint) {
  const auto [fixture, kind] = GetParam();
  const test::MlxPair p = test::make_mlx(fixture, kind);
  if (p.mlx.empty()) GTEST_SKIP() << "../shared absent";
  ASSERT_TRUE(is_mlx_checkpoint(p.mlx));
  ASSERT_FALSE(is_mlx_checkpoint(p.ref));
  const std::string out = import(p.mlx, std::string("mlx-out-") + kind);
  auto eng = load_model(out);
  auto ref = load_model(p.ref);
  EXPECT_FALSE(eng->has_mtp());
  for (const char* name : {"p0", "p1", "p2"}) {
    const float worst = test::max_logit_diff(*eng, *ref, fixture, name);
    std::printf("%s %s %s: max |logit - dequantized reference| = %.3g\n", fixture, kind, name, worst);
    EXPECT_LE(worst, test::logit_bound(fixture)) << fixture << " " << kind << " " << name;
  }
}

// Every imported matrix, dequantized as the engine does (quant/affine: scale·q + bias in float),
// is the reference checkpoint's float32 tensor bit for bit; the norms the import takes 1 from
// are the reference's too.
TEST_P(MlxImport, DequantizedWeightsAreTheReferenceBits) {
  const auto [fixture, kind] = GetParam();
  const test::MlxPair p = test::make_mlx(fixture, kind);
  if (p.mlx.empty()) GTEST_SKIP() << "../shared absent";
  const std::string out = import(p.mlx, std::string("mlx-deq-") + kind);
  EXPECT_GT(test::expect_weights_equal(out, p.ref), 0);
}

// The bytes of `size` at `offset` of tensor t's expert e slice (stacked [E, ...]).
std::string slice(const TensorView& t, size_t e, size_t n) {
  return std::string(static_cast<const char*>(t.data) + e * n, n);
}

// Every quantized tensor's codes, scales and biases, dense and expert, as the source stores them.
TEST_P(MlxImport, CodesScalesAndBiasesAreTheSourceBytes) {
  const auto [fixture, kind] = GetParam();
  const test::MlxPair p = test::make_mlx(fixture, kind);
  if (p.mlx.empty()) GTEST_SKIP() << "../shared absent";
  const std::string out = import(p.mlx, std::string("mlx-bytes-") + kind);
  const TensorStore src = TensorStore::open(p.mlx);
  const TensorStore dense = TensorStore::open(out + "/" + kEngineDenseFile);
  const ModelConfig cfg = load_config(out);
  const EngineIndex index = read_engine_index(out, cfg);
  int dense_quantized = 0, expert_projections = 0;
  for (const std::string& name : src.names()) {
    const TensorView& t = src.get(name);
    if (t.dtype != DType::U32 || name.find(".switch_mlp.") != std::string::npos) continue;
    const std::string module = name.substr(0, name.size() - 7);
    for (auto [suffix, engine] : {std::pair{".weight", ".weight.q"}, {".scales", ".weight.scales"}, {".biases", ".weight.biases"}}) {
      const TensorView& a = src.get(module + suffix);
      const TensorView& b = dense.get(module + engine);
      ASSERT_EQ(a.nbytes, b.nbytes) << name;
      EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << module << suffix;
    }
    ++dense_quantized;
  }
  for (const ExpertLayer& layer : index.layers) {
    std::ifstream blob(out + "/" + layer.file, std::ios::binary);
    std::string rec(layer.stride, '\0');
    for (int e = 0; e < layer.n_experts; ++e) {
      blob.read(rec.data(), std::streamsize(layer.stride));
      for (size_t i = 0; i < 3; ++i) {
        const ProjLayout& pl = layer.proj[i];
        const std::string m = layer.name + ".switch_mlp." + kExpertProjections[i] + "_proj";
        EXPECT_EQ(rec.substr(pl.q_offset, pl.q_bytes), slice(src.get(m + ".weight"), size_t(e), pl.q_bytes)) << m << " " << e;
        if (pl.bits == kRawBits) continue;
        EXPECT_EQ(rec.substr(pl.scales_offset, pl.scales_bytes), slice(src.get(m + ".scales"), size_t(e), pl.scales_bytes));
        EXPECT_EQ(rec.substr(pl.biases_offset, pl.scales_bytes), slice(src.get(m + ".biases"), size_t(e), pl.scales_bytes));
        ++expert_projections;
      }
    }
  }
  EXPECT_GT(dense_quantized, 0);
  EXPECT_GT(expert_projections, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlxImport,
                         ::testing::Values(Case{"qwen3-next-tiny", "default"}, Case{"qwen3-next-tiny", "mixed"},
                                           Case{"qwen3-next-tiny", "f16"}, Case{"qwen3-moe-tiny", "default"},
                                           Case{"qwen3-moe-tiny", "mixed"}),
                         case_name);

// The mixed case records each projection's own bits and group in the index.
TEST(MlxImportMixed, PerModuleBitsReachTheIndex) {
  const test::MlxPair p = test::make_mlx("qwen3-next-tiny", "mixed");
  if (p.mlx.empty()) GTEST_SKIP() << "../shared absent";
  const std::string out = import(p.mlx, "mlx-mixed-index");
  const EngineIndex index = read_engine_index(out, load_config(out));
  const ExpertLayer* l1 = index.find("model.layers.1.mlp");
  const ExpertLayer* l2 = index.find("model.layers.2.mlp");
  ASSERT_TRUE(l1 && l2);
  EXPECT_EQ(l1->proj[1].bits, 2);
  EXPECT_EQ(l1->proj[1].group, 128);
  EXPECT_EQ(l1->proj[2].bits, 8);
  EXPECT_EQ(l1->proj[2].group, 32);
  EXPECT_EQ(l2->proj[0].bits, 3);
  EXPECT_EQ(l2->proj[0].group, 64);
  const ExpertLayer* l3 = index.find("model.layers.3.mlp");
  ASSERT_TRUE(l3);
  EXPECT_EQ(l3->proj[0].bits, 6);
  EXPECT_EQ(l3->proj[1].bits, 5);
  EXPECT_EQ(l3->proj[1].group, 32);
  const TensorStore dense = TensorStore::open(out + "/" + kEngineDenseFile);
  EXPECT_TRUE(dense.has("model.layers.0.linear_attn.out_proj.weight"));  // left unquantized (false)
  EXPECT_TRUE(dense.has("model.layers.0.mlp.gate.weight.q"));           // the 8-bit router
}

// --mtp-from takes the MTP head from the Hugging Face checkpoint.
TEST(MlxImportMtp, MtpHeadFromTheOriginalCheckpoint) {
  const test::MlxPair p = test::make_mlx("qwen3-next-tiny", "default");
  if (p.mlx.empty()) GTEST_SKIP() << "../shared absent";
  const std::string hf = test::shared_path("fixtures/qwen3-next-tiny");
  const std::string out = import(p.mlx, "mlx-mtp", {.mtp_from = hf});
  auto eng = load_model(out);
  ASSERT_TRUE(eng->has_mtp());
  const TensorStore dense = TensorStore::open(out + "/" + kEngineDenseFile);
  const TensorStore orig = TensorStore::open(hf);
  const TensorView& a = dense.get("mtp.fc.weight");
  const TensorView& b = orig.get("mtp.fc.weight");
  ASSERT_EQ(a.nbytes, b.nbytes);
  EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0);
  TensorStore prompts = TensorStore::open(hf + "/reference.safetensors");
  std::vector<int> ids = test::ints(prompts.get("p1.input_ids"));
  State s = eng->new_state();
  const ForwardResult r = eng->forward(ids.data(), int(ids.size()), s, {.all_logits = true, .hidden = true});
  for (float v : eng->mtp_forward(r.hidden_pre_norm.data(), ids.data() + 1, int(ids.size()) - 1, 0, s))
    ASSERT_TRUE(std::isfinite(v));
  test::expect_error([&] { import(p.mlx, "mlx-mtp-moe", {.mtp_from = test::shared_path("fixtures/qwen3-moe-tiny")}); },
                     {"--mtp-from", "another model"});
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }
void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(1); }

TEST(MlxImportErrors, BadCheckpointsNamed) {
  const test::MlxPair p = test::make_mlx("qwen3-moe-tiny", "default");
  if (p.mlx.empty()) GTEST_SKIP() << "../shared absent";
  const std::string cfg_path = p.mlx + "/config.json";
  const nlohmann::json good = read_json(cfg_path);

  nlohmann::json j = good;
  j.erase("quantization");
  j.erase("quantization_config");
  write_json(cfg_path, j);
  test::expect_error([&] { import(p.mlx, "mlx-bad-1"); }, {"config.json", "'quantization'"});

  j = good;
  j["quantization"]["mode"] = "mxfp4";
  write_json(cfg_path, j);
  test::expect_error([&] { import(p.mlx, "mlx-bad-2"); }, {"config.json", "mode", "mxfp4"});

  j = good;  // the router stored at 8 bits, declared 4: its codes do not have the declared shape
  j["quantization"]["model.layers.0.mlp.gate"]["bits"] = 4;
  write_json(cfg_path, j);
  test::expect_error([&] { import(p.mlx, "mlx-bad-3"); }, {"model.safetensors", "model.layers.0.mlp.gate.weight"});

  j = good;
  j["quantization"]["bits"] = 7;
  write_json(cfg_path, j);
  test::expect_error([&] { import(p.mlx, "mlx-bad-4"); }, {"config.json", "quantization.bits 7"});
  write_json(cfg_path, good);

  // Requantizing flags are refused by name (without --mtp-from, which they would shape).
  ConvertOptions opt;
  opt.from = p.mlx;
  opt.out = test::scratch_dir("mlx-bad-5") + "/model";
  opt.dense_bits = 8;
  test::expect_error([&] { convert_checkpoint(opt); }, {"--dense-bits", "MLX", "own quantization"});
}

}  // namespace
}  // namespace ms
