// The engine directory's record layout and index (format/engine_dir), and the streaming
// safetensors writer the converter uses for dense.safetensors.
#include "format/engine_dir.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "test_support.h"
#include "util/error.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ModelConfig tiny_config() {
  ModelConfig c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.hidden = 256, c.n_layers = 2, c.vocab = 100, c.n_experts = 3, c.top_k = 2, c.moe_inter = 64;
  return c;
}

std::array<ProjSpec, 3> specs(int gate_bits, int up_bits, int down_bits, int group) {
  return {ProjSpec{gate_bits, group, 64, 256}, ProjSpec{up_bits, group, 64, 256}, ProjSpec{down_bits, group, 256, 64}};
}

TEST(EngineDir, RecordLayoutIsAlignedAndTight) {
  for (int bits : {2, 3, 4, 8, 16}) {
    const ExpertLayer l = plan_expert_layer("model.layers.0.mlp", "experts/layer_000.bin", 4, specs(bits, bits, bits, 32));
    size_t end = 0;
    for (size_t i = 0; i < 3; ++i) {
      const ProjLayout& p = l.proj[i];
      EXPECT_EQ(p.q_offset % kRecordRegionAlign, 0u);
      EXPECT_GE(p.q_offset, end);
      EXPECT_EQ(p.q_bytes, size_t(p.rows) * size_t(p.cols) * size_t(bits) / 8) << bits;
      end = p.q_offset + p.q_bytes;
      if (bits == 16) {
        EXPECT_EQ(p.scales_bytes, 0u);
        continue;
      }
      EXPECT_EQ(p.scales_bytes, size_t(p.rows) * size_t(p.cols / 32) * 2);
      EXPECT_EQ(p.scales_offset % kRecordRegionAlign, 0u);
      EXPECT_GE(p.scales_offset, end);
      EXPECT_GE(p.biases_offset, p.scales_offset + p.scales_bytes);
      end = p.biases_offset + p.scales_bytes;
    }
    EXPECT_EQ(l.record_bytes, end);
    EXPECT_EQ(l.stride % kExpertStrideAlign, 0u);
    EXPECT_GE(l.stride, l.record_bytes);
    EXPECT_LT(l.stride - l.record_bytes, kExpertStrideAlign);
  }
}

TEST(EngineDir, PlanRejectsBadBitsAndGroups) {
  EXPECT_NE(error_of([] { plan_expert_layer("L", "f", 2, specs(5, 4, 4, 64)); }).find("gate"), std::string::npos);
  // down_proj has 64 input columns: not a multiple of 128.
  const std::string e = error_of([] { plan_expert_layer("L", "f", 2, specs(4, 4, 4, 128)); });
  EXPECT_NE(e.find("down"), std::string::npos) << e;
  EXPECT_NE(e.find("128"), std::string::npos) << e;
  EXPECT_NE(error_of([] { plan_expert_layer("L", "f", 2, specs(4, 4, 4, 48)); }).find("group 48"), std::string::npos);
  EXPECT_NE(error_of([] { plan_expert_layer("L", "f", 0, specs(4, 4, 4, 64)); }).find("n_experts"), std::string::npos);
}

TEST(EngineDir, ExpertFileNames) {
  EXPECT_EQ(expert_file_name("model.layers.3.mlp"), "experts/layer_003.bin");
  EXPECT_EQ(expert_file_name("model.layers.47.mlp"), "experts/layer_047.bin");
  EXPECT_EQ(expert_file_name("mtp.layers.0.mlp"), "experts/mtp_layer_000.bin");
}

// An engine directory with one expert layer of 3 experts whose records are filled with a
// byte pattern; returns the directory.
std::string write_dir(const ModelConfig& cfg, EngineIndex* index_out = nullptr) {
  const std::string dir = test::scratch_dir("engine");
  fs::create_directory(dir + "/experts");
  ExpertLayer l = plan_expert_layer("model.layers.1.mlp", expert_file_name("model.layers.1.mlp"), 3, specs(4, 3, 8, 64));
  std::vector<uint8_t> blob(3 * l.stride, 0);
  for (int e = 0; e < 3; ++e) {
    uint8_t* rec = blob.data() + size_t(e) * l.stride;
    for (size_t i = 0; i < l.record_bytes; ++i) rec[i] = uint8_t(i * 7 + size_t(e));
    l.checksums.push_back(record_checksum(rec, l.record_bytes));
  }
  std::ofstream(dir + "/" + l.file, std::ios::binary).write(reinterpret_cast<const char*>(blob.data()), std::streamsize(blob.size()));
  EngineIndex index{cfg.architecture, 8, 64, {l}};
  std::ofstream(dir + "/moestream.json") << engine_index_json(index, cfg);
  if (index_out) *index_out = index;
  return dir;
}

TEST(EngineDir, IndexRoundTripsAndIsDeterministic) {
  const ModelConfig cfg = tiny_config();
  EngineIndex written;
  const std::string dir = write_dir(cfg, &written);
  EXPECT_TRUE(is_engine_dir(dir));
  EXPECT_FALSE(is_engine_dir(test::scratch_dir("plain")));
  const EngineIndex read = read_engine_index(dir, cfg);
  EXPECT_EQ(engine_index_json(read, cfg), engine_index_json(written, cfg));
  ASSERT_EQ(read.layers.size(), 1u);
  EXPECT_EQ(read.layers[0].checksums, written.layers[0].checksums);
  EXPECT_EQ(read.dense_bits, 8);
  ASSERT_NE(read.find("model.layers.1.mlp"), nullptr);
  EXPECT_EQ(read.find("model.layers.0.mlp"), nullptr);

  ExpertBlobs blobs(dir, read);
  const ExpertLayer& l = blobs.index().layers[0];
  for (int e = 0; e < 3; ++e) blobs.verify(l, e);
  EXPECT_EQ(blobs.record(l, 2)[0], 2);
  EXPECT_NE(error_of([&] { blobs.record(l, 3); }).find("expert 3"), std::string::npos);
}

// Each edit of a valid index must be caught, naming the field.
TEST(EngineDir, IndexEditsAreRejected) {
  const ModelConfig cfg = tiny_config();
  const std::string dir = write_dir(cfg);
  const json good = json::parse(std::ifstream(dir + "/moestream.json"));
  auto check = [&](const std::function<void(json&)>& edit, const std::string& want) {
    json j = good;
    edit(j);
    std::ofstream(dir + "/moestream.json") << j.dump();
    const std::string e = error_of([&] { read_engine_index(dir, cfg); });
    EXPECT_NE(e.find(want), std::string::npos) << "wanted '" << want << "' in: " << e;
    EXPECT_NE(e.find("moestream.json"), std::string::npos) << e;
  };
  check([](json& j) { j["version"] = 2; }, "version 2");
  check([](json& j) { j["format"] = "gguf"; }, "format");
  check([](json& j) { j["dims"]["hidden_size"] = 512; }, "hidden_size");
  check([](json& j) { j["architecture"] = "Qwen3NextForCausalLM"; }, "architecture");
  check([](json& j) { j["expert_layers"][0]["stride"] = 4096; }, "stride");
  check([](json& j) { j["expert_layers"][0]["projections"]["down"]["q_offset"] = 0; }, "q_offset");
  check([](json& j) { j["expert_layers"][0]["projections"]["up"]["bits"] = 5; }, "bits 5");
  check([](json& j) { j["expert_layers"][0]["checksums"].erase(0); }, "checksums");
  check([](json& j) { j["expert_layers"][0]["checksums"][1] = "xyz"; }, "checksums[1]");
  check([](json& j) { j["expert_layers"][0].erase("n_experts"); }, "n_experts");
}

TEST(EngineDir, TruncatedOrCorruptBlobIsNamed) {
  const ModelConfig cfg = tiny_config();
  const std::string dir = write_dir(cfg);
  const EngineIndex index = read_engine_index(dir, cfg);
  const std::string blob = dir + "/experts/layer_001.bin";
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(index.layers[0].stride + 10));
    f.put('\xff');
  }
  ExpertBlobs blobs(dir, index);
  blobs.verify(blobs.index().layers[0], 0);
  std::string e = error_of([&] { blobs.verify(blobs.index().layers[0], 1); });
  EXPECT_NE(e.find("layer_001.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("expert 1"), std::string::npos) << e;
  fs::resize_file(blob, fs::file_size(blob) - 1);
  e = error_of([&] { ExpertBlobs(dir, index); });
  EXPECT_NE(e.find("layer_001.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("expected"), std::string::npos) << e;
  fs::remove(blob);
  e = error_of([&] { ExpertBlobs(dir, index); });
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

// Pieces written in any order give the file write_safetensors writes from whole tensors.
TEST(SafetensorsWriter, PiecesInAnyOrderMatchTheWholeFileWriter) {
  const std::string dir = test::scratch_dir("stwriter");
  std::vector<uint8_t> a(1000), b(24);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 100);
  write_safetensors(dir + "/whole.safetensors", {{"a", DType::U8, {10, 100}, a}, {"b.scales", DType::BF16, {3, 4}, b}});
  SafetensorsWriter w(dir + "/pieces.safetensors", {{"a", DType::U8, {10, 100}}, {"b.scales", DType::BF16, {3, 4}}});
  w.write(1, 12, b.data() + 12, 12);
  w.write(0, 500, a.data() + 500, 500);
  w.write(1, 0, b.data(), 12);
  w.write(0, 0, a.data(), 500);
  EXPECT_NE(error_of([&] { w.write(1, 20, b.data(), 8); }).find("past the end"), std::string::npos);
  w.close();
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(slurp(dir + "/pieces.safetensors"), slurp(dir + "/whole.safetensors"));
  TensorStore s = TensorStore::open(dir + "/pieces.safetensors");
  EXPECT_EQ(std::memcmp(s.get("a").data, a.data(), a.size()), 0);
}

}  // namespace
}  // namespace ms
