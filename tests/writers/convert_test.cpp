// moestream convert: exactness at 16 bits against the Hugging Face checkpoint, the error cases,
// the loader's checks of an engine directory, and the quality gates of quantized experts on
// pycoder-moe.
#include "writers/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/engine_dir.h"
#include "backends/load.h"
#include "model/model.h"
#include "test_support.h"
#include "util/error.h"

// GCC 12 warns on designated initializers that leave ConvertOptions' std::map members default.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace ms {
namespace {

using test::ints;

namespace fs = std::filesystem;

std::string convert(const std::string& from, ConvertOptions opt, const std::string& tag) {
  opt.from = from;
  opt.out = test::scratch_dir(tag) + "/model";
  convert_checkpoint(opt);
  return opt.out;
}

// The error text of f(), or "" when it does not throw ms::Error.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has_temp_leftovers(const fs::path& parent) {
  for (auto& e : fs::directory_iterator(parent))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) return true;
  return false;
}

// A copy of a fixture (config.json, model.safetensors) that the test may alter.
std::string copy_fixture(const std::string& dir, const std::string& tag) {
  const std::string out = test::scratch_dir(tag);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fs::path(dir) / f, fs::path(out) / f);
  return out;
}

class FixtureAt16Bits : public ::testing::TestWithParam<const char*> {};

// --expert-bits 16 keeps every weight's bits: the engine directory must give the very logits
// (and MTP logits) of the checkpoint it came from, bit for bit.
TEST_P(FixtureAt16Bits, LogitsBitIdenticalToCheckpoint) {
  MS_REQUIRE_SHARED(std::string("fixtures/") + GetParam(), dir);
  const std::string out = convert(dir, {.expert_bits = 16}, "fixture16");
  auto hf = load_model(dir);
  auto eng = load_model(out);
  ASSERT_TRUE(is_engine_dir(out));
  EXPECT_EQ(eng->has_mtp(), hf->has_mtp());
  TensorStore ref = TensorStore::open(dir + "/reference.safetensors");
  for (const char* p : {"p0", "p1", "p2"}) {
    std::vector<int> ids = ints(ref.get(std::string(p) + ".input_ids"));
    const int T = int(ids.size());
    State s1 = hf->new_state(), s2 = eng->new_state();
    ForwardResult a = hf->forward(ids.data(), T, s1, {.all_logits = true, .hidden = true});
    ForwardResult b = eng->forward(ids.data(), T, s2, {.all_logits = true, .hidden = true});
    EXPECT_EQ(a.logits, b.logits) << GetParam() << " " << p;
    if (hf->has_mtp()) {
      EXPECT_EQ(hf->mtp_forward(a.hidden_pre_norm.data(), ids.data() + 1, T - 1, 0, s1),
                eng->mtp_forward(b.hidden_pre_norm.data(), ids.data() + 1, T - 1, 0, s2))
          << GetParam() << " " << p;
    }
  }
  EXPECT_EQ(eng->weights().expert_params, hf->weights().expert_params);
  EXPECT_EQ(eng->weights().dense_params, hf->weights().dense_params);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureAt16Bits, ::testing::Values("qwen3-next-tiny", "qwen3-moe-tiny"));

TEST(Convert, RefusesExistingOutputWithoutForce) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  const std::string out = test::scratch_dir("existing") + "/model";
  fs::create_directory(out);
  std::ofstream(out + "/keep.txt") << "mine";
  const std::string err = error_of([&] { convert_checkpoint({.from = dir, .out = out, .expert_bits = 16}); });
  EXPECT_NE(err.find("already exists"), std::string::npos) << err;
  EXPECT_NE(err.find("--force"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(out + "/keep.txt"));
  convert_checkpoint({.from = dir, .out = out, .expert_bits = 16, .force = true});
  EXPECT_FALSE(fs::exists(out + "/keep.txt"));
  EXPECT_TRUE(is_engine_dir(out));
  EXPECT_FALSE(has_temp_leftovers(fs::path(out).parent_path()));
}

TEST(Convert, UnsupportedArchitectureNamed) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  const std::string src = copy_fixture(dir, "arch");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  cfg["architectures"] = {"LlamaForCausalLM"};
  std::ofstream(src + "/config.json") << cfg.dump();
  const std::string out = test::scratch_dir("arch-out") + "/model";
  const std::string err = error_of([&] { convert_checkpoint({.from = src, .out = out}); });
  EXPECT_NE(err.find("LlamaForCausalLM"), std::string::npos) << err;
  EXPECT_NE(err.find("not supported"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out));
}

TEST(Convert, MissingShardNamed) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  const std::string src = copy_fixture(dir, "shard");
  // Split into two shards on paper: the index names a second file that is not there.
  TensorStore store = TensorStore::open(src + "/model.safetensors");
  nlohmann::json index;
  bool second = false;
  for (const std::string& name : store.names()) {
    index["weight_map"][name] = second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    second = !second;
  }
  fs::rename(src + "/model.safetensors", src + "/model-00001-of-00002.safetensors");
  std::ofstream(src + "/model.safetensors.index.json") << index.dump();
  const std::string out = test::scratch_dir("shard-out") + "/model";
  const std::string err = error_of([&] { convert_checkpoint({.from = src, .out = out}); });
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(has_temp_leftovers(fs::path(out).parent_path()));
}

TEST(Convert, UnexpectedDtypeNamed) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  const std::string src = test::scratch_dir("dtype");
  fs::copy_file(dir + "/config.json", src + "/config.json");
  TensorStore store = TensorStore::open(dir + "/model.safetensors");
  std::vector<TensorData> tensors;
  const std::string bad = "model.layers.1.mlp.experts.3.up_proj.weight";
  for (const std::string& name : store.names()) {
    const TensorView& t = store.get(name);
    TensorData d{name, t.dtype, t.shape, {}};
    d.bytes.assign(static_cast<const uint8_t*>(t.data), static_cast<const uint8_t*>(t.data) + t.nbytes);
    if (name == bad) d.dtype = DType::I16;  // same size, not a float
    tensors.push_back(std::move(d));
  }
  write_safetensors(src + "/model.safetensors", tensors);
  const std::string out = test::scratch_dir("dtype-out") + "/model";
  const std::string err = error_of([&] { convert_checkpoint({.from = src, .out = out}); });
  EXPECT_NE(err.find(bad), std::string::npos) << err;
  EXPECT_NE(err.find("I16"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(has_temp_leftovers(fs::path(out).parent_path()));
}

TEST(Convert, BadOptionsNamed) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  const std::string out = test::scratch_dir("opts") + "/model";
  EXPECT_NE(error_of([&] { convert_checkpoint({.from = dir, .out = out, .expert_bits = 5}); }).find("--expert-bits"),
            std::string::npos);
  EXPECT_NE(error_of([&] { convert_checkpoint({.from = dir, .out = out, .layer_bits = {{"9", 4}}}); }).find("layer 9"),
            std::string::npos);
  EXPECT_NE(error_of([&] { convert_checkpoint({.from = dir, .out = out, .proj_bits = {{"gait", 4}}}); }).find("gait"),
            std::string::npos);
  // moe_intermediate_size 64 does not split into groups of 128: down_proj is named.
  const std::string g = error_of([&] { convert_checkpoint({.from = dir, .out = out, .expert_group = 128}); });
  EXPECT_NE(g.find("down"), std::string::npos) << g;
  EXPECT_NE(g.find("--expert-group"), std::string::npos) << g;
  EXPECT_THROW(parse_bits_list("--proj-bits", "gate=2,up", '='), Error);
  EXPECT_EQ(parse_bits_list("--layer-bits", "0:8,mtp:3", ':'), (std::map<std::string, int>{{"0", 8}, {"mtp", 3}}));
}

// Per-projection and per-layer bits land in the index and the model runs on them.
TEST(Convert, MixedBitsRecordedPerLayerAndProjection) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", dir);
  const std::string out = convert(
      dir, {.expert_bits = 4, .expert_group = 32, .proj_bits = {{"gate", 2}, {"down", 3}}, .layer_bits = {{"1", 8}, {"mtp", 16}}},
      "mixed");
  auto model = load_model(out);
  const EngineIndex index = read_engine_index(out, model->config());
  ASSERT_EQ(index.layers.size(), 9u);
  EXPECT_EQ(index.layers[0].proj[0].bits, 2);
  EXPECT_EQ(index.layers[0].proj[1].bits, 4);
  EXPECT_EQ(index.layers[0].proj[2].bits, 3);
  EXPECT_EQ(index.layers[0].proj[2].group, 32);
  for (auto& p : index.layers[1].proj) EXPECT_EQ(p.bits, 8);
  EXPECT_EQ(index.layers[8].name, "mtp.layers.0.mlp");
  for (auto& p : index.layers[8].proj) EXPECT_EQ(p.bits, 16);
  for (auto& l : index.layers) EXPECT_EQ(l.stride % 4096, 0u);
  std::vector<int> ids{1, 5, 9, 200, 7};
  State s = model->new_state();
  ForwardResult r = model->forward(ids.data(), 5, s, {.all_logits = true});
  for (float v : r.logits) ASSERT_TRUE(std::isfinite(v));
}

// docs/FORMAT.md's dense rules: matrices at --dense-bits, embedding and lm_head at least 8
// bits, routers and non-matrices as stored.
TEST(Convert, DenseQuantizationRules) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", dir);
  const std::string out = convert(dir, {.expert_bits = 16, .dense_bits = 4, .dense_group = 32}, "dense4");
  TensorStore dense = TensorStore::open(out + "/dense.safetensors");
  auto shape_of = [&](const std::string& n) { return dense.get(n).shape; };
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape_of("model.embed_tokens.weight.q"), (S{1024, 128}));  // 8 bits
  EXPECT_EQ(shape_of("lm_head.weight.q"), (S{1024, 128}));
  EXPECT_EQ(shape_of("lm_head.weight.scales"), (S{1024, 4}));
  EXPECT_EQ(shape_of("model.layers.0.linear_attn.in_proj_qkvz.weight.q"), (S{384, 64}));  // 4 bits
  EXPECT_EQ(dense.get("model.layers.0.linear_attn.in_proj_qkvz.weight.biases").dtype, DType::BF16);
  for (const char* kept : {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.shared_expert_gate.weight",
                           "model.layers.0.linear_attn.conv1d.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.0.linear_attn.A_log"}) {
    ASSERT_TRUE(dense.has(kept)) << kept;
    EXPECT_EQ(dense.get(kept).dtype, DType::BF16) << kept;
    EXPECT_FALSE(dense.has(std::string(kept) + ".q")) << kept;
  }
  for (const std::string& n : dense.names()) EXPECT_EQ(n.find(".experts."), std::string::npos) << n;

  // The model runs on it. (No closeness check here: this random-weight fixture is chaotic,
  // 0.1 % noise on its embedding alone moves the logits' cosine to 0.995; pycoder-moe's
  // quality test below measures quantized dense weights.)
  auto q = load_model(out);
  EXPECT_TRUE(q->has_mtp());
  std::vector<int> ids{1, 17, 300, 42, 5, 900, 64};
  State s = q->new_state();
  for (float v : q->forward(ids.data(), 7, s, {.all_logits = true}).logits) ASSERT_TRUE(std::isfinite(v));
}

// Convert writes format version 2: every record starts with the header naming its layer and
// expert, and the index holds dense.safetensors' checksums, which --verify checks at load.
TEST(Convert, WritesVersion2WithRecordHeadersAndDenseChecksums) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  const std::string out = convert(dir, {.expert_bits = 4, .dense_bits = 8}, "v2");
  const EngineIndex index = read_engine_index(out, load_config(out));
  EXPECT_EQ(index.version, kEngineFormatVersion);
  ExpertBlobs blobs(out, index);
  for (const ExpertLayer& l : blobs.index().layers) {
    EXPECT_EQ(l.header_bytes, kRecordHeaderBytes);
    for (int e = 0; e < l.n_experts; ++e) {
      blobs.verify(l, e);  // checks the header, then the checksum
      EXPECT_EQ(std::memcmp(blobs.record(l, e), kRecordMagic, sizeof kRecordMagic), 0);
    }
  }
  const SafetensorsFile dense(out + "/" + kEngineDenseFile);
  EXPECT_EQ(index.dense_checksums.tensors.size(), dense.tensors().size());
  ModelOptions verify;
  verify.experts.verify = true;
  EXPECT_NO_THROW(load_model(out, verify));
  // The same conversion as version 1 differs only by the headers: same dense file, and each
  // record's bytes after its header are the version-1 record.
  const std::string v1 = convert(dir, {.expert_bits = 4, .dense_bits = 8, .format_version = 1}, "v1");
  const EngineIndex index1 = read_engine_index(v1, load_config(v1));
  ExpertBlobs blobs1(v1, index1);
  const ExpertLayer& a = blobs.index().layers[1];
  const ExpertLayer& b = blobs1.index().layers[1];
  ASSERT_EQ(a.record_bytes, b.record_bytes + kRecordHeaderBytes);
  EXPECT_EQ(std::memcmp(blobs.record(a, 3) + kRecordHeaderBytes, blobs1.record(b, 3), b.record_bytes), 0);
}

// The loader checks what it maps: a truncated blob, an index whose offsets were edited, and
// (on request) a record whose bytes changed are each named.
TEST(Convert, LoaderRejectsDamagedDirectory) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  const std::string out = convert(dir, {.expert_bits = 4}, "damaged");
  const std::string blob = out + "/experts/layer_002.bin";
  {
    ExpertBlobs blobs(out, read_engine_index(out, load_config(out)));
    const ExpertLayer& l = blobs.index().layers[2];
    blobs.verify(l, 5);
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(5 * l.stride + 100));
    f.put('\x5a');
    f.close();
    const std::string err = error_of([&] { blobs.verify(l, 5); });
    EXPECT_NE(err.find("layer_002.bin"), std::string::npos) << err;
    EXPECT_NE(err.find("expert 5"), std::string::npos) << err;
    EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  }
  fs::resize_file(blob, fs::file_size(blob) - 4096);
  std::string err = error_of([&] { load_model(out); });
  EXPECT_NE(err.find("layer_002.bin"), std::string::npos) << err;
  EXPECT_NE(err.find("model.layers.2.mlp"), std::string::npos) << err;

  const std::string out2 = convert(dir, {.expert_bits = 4}, "edited");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(out2 + "/moestream.json"));
  j["expert_layers"][1]["projections"]["up"]["scales_offset"] = 0;
  std::ofstream(out2 + "/moestream.json") << j.dump();
  err = error_of([&] { load_model(out2); });
  EXPECT_NE(err.find("model.layers.1.mlp"), std::string::npos) << err;
  EXPECT_NE(err.find("scales_offset"), std::string::npos) << err;
}

// The embedded default model (models/pycoder-moe-q4) is exactly what converting pycoder-moe
// today writes: a change of format or quantization cannot leave a stale copy behind.
// Regenerate: moestream convert --from ../shared/models/pycoder-moe --out models/pycoder-moe-q4
//             --expert-bits 4 --expert-group 64 --dense-bits 8 --dense-group 64 --force
TEST(Convert, EmbeddedDefaultModelIsReproducedByteForByte) {
  MS_REQUIRE_SHARED("models/pycoder-moe", dir);
  const fs::path committed = fs::path(MOESTREAM_SOURCE_DIR) / "models/pycoder-moe-q4";
  ASSERT_TRUE(is_engine_dir(committed.string())) << committed << " is missing";
  const fs::path fresh =
      convert(dir, {.expert_bits = 4, .expert_group = 64, .dense_bits = 8, .dense_group = 64}, "embedded");
  // What runs keep beside a model (docs/FORMAT.md) is not part of it.
  auto kept_by_runs = [](const fs::path& rel) { return rel == "usage.json" || rel == "pool_profile.json"; };
  auto files = [&](const fs::path& root) {
    std::map<std::string, std::string> m;
    for (auto& e : fs::recursive_directory_iterator(root))
      if (e.is_regular_file() && !kept_by_runs(fs::relative(e.path(), root))) {
        std::ifstream in(e.path(), std::ios::binary);
        m[fs::relative(e.path(), root).string()] = std::string(std::istreambuf_iterator<char>(in), {});
      }
    return m;
  };
  const auto want = files(committed), got = files(fresh);
  ASSERT_EQ(want.size(), got.size());
  for (auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs from the committed copy";
  }
}

// ---- quality gates on pycoder-moe ----

struct Quality {
  double cosine = 0, top1 = 0, ppl = 0;
};

constexpr int kDocs = 4, kTokens = 512;

// Teacher-forced logits of the first kTokens tokens of doc0..doc3, concatenated.
std::vector<std::vector<float>> doc_logits(const Model& m, const TensorStore& routes) {
  std::vector<std::vector<float>> out;
  for (int d = 0; d < kDocs; ++d) {
    std::vector<int> ids = ints(routes.get("doc" + std::to_string(d) + ".tokens"));
    ids.resize(kTokens);
    State s = m.new_state();
    out.push_back(m.forward(ids.data(), kTokens, s, {.all_logits = true}).logits);
  }
  return out;
}

Quality compare(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& got,
                const TensorStore& routes, int V) {
  Quality q;
  double nll = 0;
  int positions = 0, predictions = 0;
  for (int d = 0; d < kDocs; ++d) {
    std::vector<int> ids = ints(routes.get("doc" + std::to_string(d) + ".tokens"));
    for (int t = 0; t < kTokens; ++t) {
      const float* a = ref[size_t(d)].data() + size_t(t) * size_t(V);
      const float* b = got[size_t(d)].data() + size_t(t) * size_t(V);
      double ab = 0, aa = 0, bb = 0;
      int arg_a = 0, arg_b = 0;
      for (int v = 0; v < V; ++v) {
        ab += double(a[v]) * b[v], aa += double(a[v]) * a[v], bb += double(b[v]) * b[v];
        if (a[v] > a[arg_a]) arg_a = v;
        if (b[v] > b[arg_b]) arg_b = v;
      }
      q.cosine += ab / std::sqrt(aa * bb);
      q.top1 += arg_a == arg_b;
      ++positions;
      if (t + 1 < kTokens) {  // perplexity of the model under test on the next token
        const double mx = b[arg_b];
        double z = 0;
        for (int v = 0; v < V; ++v) z += std::exp(double(b[v]) - mx);
        nll += mx + std::log(z) - b[ids[size_t(t) + 1]];
        ++predictions;
      }
    }
  }
  q.cosine /= positions;
  q.top1 /= positions;
  q.ppl = std::exp(nll / predictions);
  return q;
}

TEST(PycoderQuality, QuantizedExpertsAgainstBf16) {
  MS_REQUIRE_SHARED("models/pycoder-moe", dir);
  TensorStore routes = TensorStore::open(dir + "/routes.safetensors");
  auto bf16 = load_model(dir);
  const int V = bf16->config().vocab;
  const auto ref = doc_logits(*bf16, routes);
  bf16.reset();
  std::printf("pycoder-moe, teacher-forced, first %d tokens of doc0..doc%d, against the bf16 checkpoint:\n", kTokens, kDocs - 1);
  struct Row {
    int bits, group, dense;
  };
  for (Row r : {Row{16, 64, 16}, Row{8, 64, 16}, Row{4, 64, 16}, Row{3, 64, 16}, Row{2, 64, 16}, Row{4, 64, 8},
                Row{4, 64, 4}}) {
    const std::string out =
        convert(dir, {.expert_bits = r.bits, .expert_group = r.group, .dense_bits = r.dense}, "pycoder-q");
    auto m = load_model(out);
    const auto got = doc_logits(*m, routes);
    if (r.bits == 16) {
      EXPECT_EQ(got, ref) << "16-bit experts must reproduce the checkpoint's logits";
    }
    const Quality q = compare(ref, got, routes, V);
    std::printf("  experts %2d-bit g%d, dense %2d-bit: cosine %.6f  top-1 %.2f %%  perplexity %.4f\n", r.bits, r.group,
                r.dense, q.cosine, 100 * q.top1, q.ppl);
    if (r.bits == 8 && r.dense == 16) {
      EXPECT_GE(q.cosine, 0.9999);
      EXPECT_GE(q.top1, 0.995);
    }
    // 4-bit experts with 16- or 8-bit dense weights (the embedded default model).
    if (r.bits == 4 && r.dense >= 8) {
      EXPECT_GE(q.cosine, 0.99);
      EXPECT_GE(q.top1, 0.95);
    }
  }
}

}  // namespace
}  // namespace ms
