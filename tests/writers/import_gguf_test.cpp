// convert --from FILE.gguf: GGUF files written by tests/data/gguf/make_gguf.py with gguf-py (from
// the llama.cpp source archive in ../shared/peers) import without changing a dequantized weight.
#include "writers/import_gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "backends/load.h"
#include "format/engine_dir.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "quant/gguf_blocks.h"
#include "test_support.h"
#include "util/error.h"
#include "writers/import_support.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace ms {
namespace {

namespace fs = std::filesystem;

std::string import(const std::string& from, const std::string& tag) {
  ConvertOptions opt;
  opt.from = from;
  opt.out = test::scratch_dir(tag) + "/model";
  convert_checkpoint(opt);
  return opt.out;
}

// Each block type's rows, carried into the affine format and dequantized as the engine does,
// are gguf-py's dequantize of them (a zero's sign aside); so are they in the widest layout, which
// two tensors of different types meet in when they make one matrix.
TEST(GgufBlocks, EveryTypeDequantizesAsGgufPy) {
  const std::string dir = test::scratch_dir("gguf-blocks");
  if (!test::make_gguf("blocks " + dir + "/b.gguf " + dir + "/ref.safetensors")) GTEST_SKIP() << "../shared absent";
  const auto f = GgufFile::open(dir + "/b.gguf");
  const TensorStore ref = TensorStore::open(dir + "/ref.safetensors");
  int types = 0;
  for (const GgufTensor& t : f->tensors()) {
    const std::vector<float> want = ref.get(t.name).to_f32();
    const int rows = int(t.rows()), cols = int(t.row_length());
    GgufAffine own;
    if (!gguf_affine_layout(t.type, &own)) {  // F32, F16, BF16: the engine reads them as stored
      TensorView v{t.name, dir, t.type == 0 ? DType::F32 : t.type == 1 ? DType::F16 : DType::BF16, {rows, cols}, t.data,
                   t.nbytes};
      EXPECT_TRUE(test::same_values(v.to_f32(), want, false)) << t.name;
      ++types;
      continue;
    }
    for (const GgufAffine& layout : {own, GgufAffine{8, 16, ScaleType::F32}}) {
      QuantBuffer qb;
      qb.rows = rows, qb.cols = cols, qb.bits = layout.bits, qb.group = layout.group;
      const size_t rb = size_t(cols) * size_t(layout.bits) / 8, words = size_t(cols / layout.group) * scale_size(layout.scale_type) / 2;
      qb.q.resize(size_t(rows) * rb);
      qb.scales.resize(size_t(rows) * words);
      qb.biases.resize(qb.scales.size());
      for (int r = 0; r < rows; ++r)
        ASSERT_TRUE(gguf_row_to_affine(t.type, t.data + size_t(r) * (t.nbytes / size_t(rows)), cols, layout,
                                       qb.q.data() + size_t(r) * rb, qb.scales.data() + size_t(r) * words,
                                       qb.biases.data() + size_t(r) * words))
            << t.name;
      QuantMat m = qb.view();
      m.scale_type = layout.scale_type;
      EXPECT_TRUE(test::same_values(test::dequantized(m), want, true))
          << t.name << " as " << layout.bits << "-bit groups of " << layout.group;
    }
    ++types;
  }
  EXPECT_EQ(types, 11);
}

// A bf16 GGUF holds the checkpoint's weights: the import runs the checkpoint (Qwen3-MoE to the
// bit; Qwen3-Next, whose A = −exp(A_log) numpy computed, within 1e-4).
TEST(GgufImport, Bf16FilesRunTheirCheckpoints) {
  for (const char* fixture : {"qwen3-moe-tiny", "qwen3-next-tiny"}) {
    const std::string hf = test::shared_path(std::string("fixtures/") + fixture);
    const std::string dir = test::scratch_dir(std::string("gguf-bf16-") + fixture);
    if (hf.empty() || !test::make_gguf("model " + hf + " " + dir + "/m.gguf BF16 " + dir + "/ref")) GTEST_SKIP();
    ASSERT_TRUE(is_gguf_file(dir + "/m.gguf"));
    const std::string out = import(dir + "/m.gguf", std::string("gguf-bf16-out-") + fixture);
    auto eng = load_model(out);
    auto ref = load_model(hf);
    test::expect_weights_equal(out, dir + "/ref");  // no quantized matrices: the float tensors, compared inside
    for (const char* p : {"p0", "p1", "p2"}) {
      const float worst = test::max_logit_diff(*eng, *ref, fixture, p);
      std::printf("%s %s: max |logit - checkpoint| = %.3g\n", fixture, p, worst);
      if (std::string(fixture) == "qwen3-moe-tiny") EXPECT_EQ(worst, 0.0f) << p;
      else EXPECT_LE(worst, 1e-4f) << p;
    }
  }
}

// Quantized GGUFs: every dequantized matrix is gguf-py's dequantize of its blocks, and the
// logits are those of the checkpoint of those weights.
class GgufQuantized : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufQuantized, WeightsAreGgufPysDequantize) {
  for (const char* fixture : {"qwen3-moe-tiny", "qwen3-next-tiny"}) {
    const std::string hf = test::shared_path(std::string("fixtures/") + fixture);
    const std::string dir = test::scratch_dir(std::string("gguf-q-") + fixture + GetParam());
    if (hf.empty() || !test::make_gguf("model " + hf + " " + dir + "/m.gguf " + GetParam() + " " + dir + "/ref")) GTEST_SKIP();
    const std::string out = import(dir + "/m.gguf", std::string("gguf-q-out-") + fixture + GetParam());
    EXPECT_GT(test::expect_weights_equal(out, dir + "/ref", true), 0) << fixture;
    auto eng = load_model(out);
    auto ref = load_model(dir + "/ref");
    for (const char* p : {"p0", "p1", "p2"}) {
      const float worst = test::max_logit_diff(*eng, *ref, fixture, p);
      std::printf("%s %s %s: max |logit - dequantized reference| = %.3g\n", fixture, GetParam(), p, worst);
      EXPECT_LE(worst, test::logit_bound(fixture)) << fixture << " " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GgufQuantized, ::testing::Values("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"));

// K-quants in a model (pycoder-moe's shape: rows of 256), as random blocks gguf-py dequantizes,
// with Qwen3-Next's attn_qkv and attn_gate of two K types meeting in one wider matrix and the
// 64-wide expert down projections falling back to Q8_0: every weight is gguf-py's.
TEST(GgufImport, KQuantModelsCarryEveryWeight) {
  const std::string hf = test::shared_path("models/pycoder-moe");
  for (const char* type : {"Q4_K", "Q5_K", "Q6_K"}) {
    const std::string dir = test::scratch_dir(std::string("gguf-k-") + type);
    if (hf.empty() || !test::make_gguf("model " + hf + " " + dir + "/m.gguf " + type + " " + dir + "/ref")) GTEST_SKIP();
    const std::string out = import(dir + "/m.gguf", std::string("gguf-k-out-") + type);
    EXPECT_GT(test::expect_weights_equal(out, dir + "/ref", true), 3000) << type;
    const TensorStore dense = TensorStore::open(out + "/" + kEngineDenseFile);
    const TensorView& qkvz = dense.get("model.layers.0.linear_attn.in_proj_qkvz.weight.scales");
    EXPECT_EQ(qkvz.dtype, DType::F32) << type;
    EXPECT_EQ(qkvz.dim(1), 256 / 16) << type << ": Q6_K's groups of 16";
  }
}

// llama-quantize's own output: tests/data/gguf/tiny256-Q4_K_M.gguf is Q4_K_M of make_gguf.py's
// tiny256 checkpoint (a BF16 GGUF of it, through llama-quantize from ../shared/peers), which mixes
// Q4_K, Q5_K, Q6_K, Q8_0 and f32. Every weight of its import is gguf-py's dequantize of its
// blocks, and its logits are the Hugging Face path's on those weights.
TEST(GgufImport, LlamaQuantizeOutputCarriesEveryWeight) {
  const std::string file = std::string(MOESTREAM_SOURCE_DIR) + "/tests/data/gguf/tiny256-Q4_K_M.gguf";
  const std::string dir = test::scratch_dir("gguf-llama-quantize");
  if (!test::make_gguf("tiny256 " + dir + "/hf")) GTEST_SKIP() << "../shared absent (gguf-py)";
  ASSERT_TRUE(test::make_gguf("model " + dir + "/hf " + dir + "/m.gguf BF16 " + dir + "/ref --blocks-from " + file));
  std::set<uint32_t> types;
  for (const GgufTensor& t : GgufFile::open(file)->tensors()) types.insert(t.type);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32})
    EXPECT_TRUE(types.count(uint32_t(t))) << ggml_type_name(uint32_t(t));
  const std::string out = import(file, "gguf-llama-quantize-out");
  EXPECT_GE(test::expect_weights_equal(out, dir + "/ref", true), 58);  // 10 dense matrices, 48 expert ones
  auto eng = load_model(out);
  auto ref = load_model(dir + "/ref");
  std::vector<int> ids;
  for (int i = 0; i < 12; ++i) ids.push_back((i * 37 + 5) % eng->config().vocab);
  State s1 = eng->new_state(), s2 = ref->new_state();
  const auto a = eng->forward(ids.data(), int(ids.size()), s1, {.all_logits = true}).logits;
  const auto b = ref->forward(ids.data(), int(ids.size()), s2, {.all_logits = true}).logits;
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  std::printf("tiny256 Q4_K_M (llama-quantize): max |logit - dequantized reference| = %.3g\n", worst);
  EXPECT_LE(worst, 1e-4f);
}

TEST(GgufImport, BadFilesNamed) {
  const std::string dir = test::scratch_dir("gguf-bad");
  if (!test::make_gguf("bad " + dir) || !test::make_gguf("blocks " + dir + "/b.gguf " + dir + "/ref.safetensors")) GTEST_SKIP();
  test::expect_error([&] { import(dir + "/foreign.gguf", "gguf-bad-1"); },
                     {"foreign.gguf", "general.architecture", "llama"});
  test::expect_error([&] { import(dir + "/unknown_type.gguf", "gguf-bad-2"); },
                     {"unknown_type.gguf", "token_embd.weight", "type 10"});
  const std::string whole = test::slurp(dir + "/b.gguf");
  for (size_t keep : {size_t(3), size_t(100), whole.size() - 1000}) {
    const std::string cut = dir + "/cut" + std::to_string(keep) + ".gguf";
    std::ofstream(cut, std::ios::binary).write(whole.data(), std::streamsize(keep));
    test::expect_error([&] { GgufFile::open(cut); }, {cut, "truncated"});
  }
  test::expect_error([&] { GgufFile::open(dir + "/b.gguf")->tensor("nope"); }, {"b.gguf", "'nope'"});
}

// The flags that requantize a Hugging Face conversion are refused by name for an import, which
// keeps its file's quantization, rather than ignored; so is --mtp-from (MLX only). Checked
// before the file is read: a GGUF magic and nothing else will do.
TEST(GgufImport, QuantizationFlagsRefused) {
  const std::string dir = test::scratch_dir("gguf-flags");
  std::ofstream(dir + "/m.gguf", std::ios::binary) << "GGUF";
  auto options = [&] {
    ConvertOptions o;
    o.from = dir + "/m.gguf";
    o.out = dir + "/out";
    return o;
  };
  std::vector<std::pair<ConvertOptions, std::string>> cases;
  cases.emplace_back(options(), "--expert-bits");
  cases.back().first.expert_bits = 2;
  cases.emplace_back(options(), "--expert-group");
  cases.back().first.expert_group = 32;
  cases.emplace_back(options(), "--proj-bits");
  cases.back().first.proj_bits = {{"down", 8}};
  cases.emplace_back(options(), "--layer-bits");
  cases.back().first.layer_bits = {{"0", 8}};
  cases.emplace_back(options(), "--dense-bits");
  cases.back().first.dense_bits = 8;
  cases.emplace_back(options(), "--dense-group");
  cases.back().first.dense_group = 32;
  cases.emplace_back(options(), "--mtp-from");
  cases.back().first.mtp_from = dir;
  for (const auto& [opt, flag] : cases) test::expect_error([&] { convert_checkpoint(opt); }, {flag});
  test::expect_error([&] { convert_checkpoint(cases[0].first); }, {"GGUF", "m.gguf", "own quantization"});
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

}  // namespace
}  // namespace ms
