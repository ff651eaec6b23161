// The engine directory's record layout and index (format/engine_dir), and the streaming
// safetensors writer the converter uses for dense.safetensors.
#include "format/engine_dir.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <functional>
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
  c.layer_types.assign(2, LayerType::FullAttention);
  c.layer_moe.assign(2, true);
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
  EXPECT_NE(error_of([] { plan_expert_layer("L", "f", 2, specs(7, 4, 4, 64)); }).find("gate"), std::string::npos);
  EXPECT_NE(error_of([] { plan_expert_layer("L", "f", 2, specs(3, 4, 4, 16)); }).find("group 16"), std::string::npos);
  // down_proj has 64 input columns: not a multiple of 128.
  const std::string e = error_of([] { plan_expert_layer("L", "f", 2, specs(4, 4, 4, 128)); });
  EXPECT_NE(e.find("down"), std::string::npos) << e;
  EXPECT_NE(e.find("128"), std::string::npos) << e;
  EXPECT_NE(error_of([] { plan_expert_layer("L", "f", 2, specs(4, 4, 4, 48)); }).find("group 48"), std::string::npos);
  EXPECT_NE(error_of([] { plan_expert_layer("L", "f", 0, specs(4, 4, 4, 64)); }).find("n_experts"), std::string::npos);
  EXPECT_NE(error_of([] { plan_expert_layer("L", "f", 1 << 20, specs(4, 4, 4, 64)); }).find("n_experts"), std::string::npos);
  const std::array<ProjSpec, 3> huge = {ProjSpec{16, 0, 1 << 21, 64}, ProjSpec{16, 0, 64, 64}, ProjSpec{16, 0, 64, 64}};
  EXPECT_NE(error_of([&] { plan_expert_layer("L", "f", 2, huge); }).find("larger than"), std::string::npos);
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
    write_record_header(l, e, rec);
    l.checksums.push_back(record_checksum(l, rec));
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
  EXPECT_EQ(blobs.record(l, 2)[kRecordHeaderBytes], uint8_t(kRecordHeaderBytes * 7 + 2));
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
  check([](json& j) { j["version"] = 4; }, "version 4");
  check([](json& j) { j["version"] = 0; }, "version 0");
  check([](json& j) { j["format"] = "gguf"; }, "format");
  check([](json& j) { j["dims"]["hidden_size"] = 512; }, "hidden_size");
  check([](json& j) { j["architecture"] = "Qwen3NextForCausalLM"; }, "architecture");
  check([](json& j) { j["expert_layers"][0]["stride"] = 4096; }, "stride");
  check([](json& j) { j["expert_layers"][0]["projections"]["down"]["q_offset"] = 0; }, "q_offset");
  check([](json& j) { j["expert_layers"][0]["projections"]["up"]["bits"] = 7; }, "bits 7");
  check([](json& j) { j["expert_layers"][0]["projections"]["up"]["scales"] = "bf16"; }, "scales");
  check([](json& j) { j["expert_layers"][0]["projections"]["up"]["scales"] = "f64"; }, "scales");
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
    f.seekp(std::streamoff(index.layers[0].stride + kRecordHeaderBytes + 10));
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

// ---- the index checked strictly: each edit is refused naming the field ----

TEST(EngineDir, StrictIndexRefusesForgedLayersFilesAndBits) {
  const ModelConfig cfg = tiny_config();
  const std::string dir = write_dir(cfg);
  const json good = json::parse(std::ifstream(dir + "/moestream.json"));
  const std::string outside = test::scratch_dir("outside") + "/layer.bin";
  fs::copy_file(dir + "/experts/layer_001.bin", outside);
  fs::create_symlink(outside, dir + "/experts/link.bin");
  auto check = [&](const std::function<void(json&)>& edit, const std::vector<std::string>& want) {
    json j = good;
    edit(j);
    std::ofstream(dir + "/moestream.json") << j.dump();
    std::vector<std::string> parts = want;
    parts.push_back("moestream.json");
    test::expect_error([&] { read_engine_index(dir, cfg); }, parts);
  };
  auto layer = [](json& j) -> json& { return j["expert_layers"][0]; };
  check([](json& j) { j["dense"]["bits"] = 5; }, {"dense.bits 5"});
  check([](json& j) { j["dense"]["bits"] = 2; }, {"dense.bits 2"});
  check([](json& j) { j["dense"]["group"] = 48; }, {"dense.group 48"});
  check([](json& j) { j["dense"]["bits"] = 16; }, {"dense.group 64"});  // 16 bits have no group
  check([](json& j) { j["dense"]["file"] = "../dense.safetensors"; }, {"dense.file"});
  check([](json& j) { j["dense"].erase("checksums"); }, {"checksums", "missing"});
  check([](json& j) { j["dense"]["header_checksum"] = "12"; }, {"dense.header_checksum"});
  check([&](json& j) {
    const json copy = layer(j);
    j["expert_layers"].push_back(copy);
  }, {"expert_layers[1]", "model.layers.1.mlp", "twice"});
  check([&](json& j) {
    json other = layer(j);
    other["name"] = "model.layers.0.mlp";
    j["expert_layers"].push_back(other);
  }, {"expert_layers[1]", "another layer"});
  check([&](json& j) { layer(j)["name"] = "model.layers.2.mlp"; }, {"model.layers.2.mlp", "num_hidden_layers 2"});
  check([&](json& j) { layer(j)["name"] = "model.layers.1.attn"; }, {"model.layers.1.attn", "not a MoE block"});
  check([&](json& j) { layer(j)["name"] = "mtp.layers.0.mlp"; }, {"mtp.layers.0.mlp"});  // not Qwen3-Next
  check([&](json& j) { layer(j)["file"] = outside; }, {"expert_layers[0]", "relative path"});
  check([&](json& j) { layer(j)["file"] = "experts/../../x.bin"; }, {"expert_layers[0]", "'..'"});
  check([&](json& j) { layer(j)["file"] = ""; }, {"expert_layers[0]", "file ''"});
  check([&](json& j) { layer(j)["file"] = "experts/link.bin"; }, {"expert_layers[0]", "experts/link.bin", "outside"});
  check([&](json& j) { layer(j)["header_bytes"] = 0; }, {"header_bytes is 0"});
  check([&](json& j) { layer(j)["n_experts"] = 4; }, {"model.layers.1.mlp", "n_experts 4", "num_experts is 3"});
  check([&](json& j) { layer(j)["projections"]["up"]["rows"] = 128; }, {"projection up", "[128, 256]", "[64, 256]"});
  check([&](json& j) { layer(j)["projections"]["down"]["cols"] = 1 << 30; }, {"projection down", "1073741824"});
  check([&](json& j) { layer(j)["projections"]["gate"]["q_offset"] = 0; }, {"q_offset"});  // the header's bytes

  ModelConfig dense_layer = cfg;
  dense_layer.layer_moe = {true, false};
  std::ofstream(dir + "/moestream.json") << good.dump();
  test::expect_error([&] { read_engine_index(dir, dense_layer); }, {"model.layers.1.mlp", "dense layer"});
}

TEST(EngineDir, IndexWithDuplicateKeysOrDeepNestingIsRefused) {
  const ModelConfig cfg = tiny_config();
  const std::string dir = write_dir(cfg);
  std::string text;
  {
    std::ifstream in(dir + "/moestream.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string twice = text;
  twice.insert(twice.find('{') + 1, "\"version\": 2, ");
  std::ofstream(dir + "/moestream.json") << twice;
  test::expect_error([&] { read_engine_index(dir, cfg); }, {"moestream.json", "'version'", "twice"});
  for (size_t depth : {300, 300000}) {
    std::ofstream(dir + "/moestream.json") << "{\"format\": " << std::string(depth, '[') << std::string(depth, ']') << "}";
    test::expect_error([&] { read_engine_index(dir, cfg); }, {"moestream.json", "deeper than"});
  }
}

// ---- record headers (version 2): a record read for the wrong layer or expert is named ----

TEST(EngineDir, RecordHeaderNamesTheRecordActuallyRead) {
  const std::array<ProjSpec, 3> spec = specs(4, 4, 4, 64);
  EngineIndex index;
  for (int l = 0; l < 2; ++l) {
    const std::string name = fmt::format("model.layers.{}.mlp", l);
    index.layers.push_back(plan_expert_layer(name, expert_file_name(name), 3, spec));
  }
  const ExpertLayer& a = index.layers[0];
  const ExpertLayer& b = index.layers[1];
  EXPECT_EQ(a.header_bytes, kRecordHeaderBytes);
  EXPECT_EQ(a.proj[0].q_offset, kRecordHeaderBytes);
  std::vector<uint8_t> rec(a.stride, 0);
  write_record_header(a, 2, rec.data());
  EXPECT_EQ(std::memcmp(rec.data(), kRecordMagic, sizeof kRecordMagic), 0);
  EXPECT_NO_THROW(check_record_header(index, a, 2, rec.data(), "a.bin"));
  test::expect_error([&] { check_record_header(index, a, 1, rec.data(), "a.bin"); },
                     {"a.bin", "layer model.layers.0.mlp, expert 1", "holds expert 2 of layer model.layers.0.mlp"});
  test::expect_error([&] { check_record_header(index, b, 2, rec.data(), "b.bin"); },
                     {"b.bin", "layer model.layers.1.mlp, expert 2", "holds expert 2 of layer model.layers.0.mlp"});
  ExpertLayer stranger = plan_expert_layer("model.layers.9.mlp", "x", 3, spec);
  std::vector<uint8_t> foreign(a.stride, 0);
  write_record_header(stranger, 0, foreign.data());
  test::expect_error([&] { check_record_header(index, a, 0, foreign.data(), "a.bin"); }, {"a.bin", "not in this directory"});
  std::vector<uint8_t> zero(a.stride, 0);
  test::expect_error([&] { check_record_header(index, a, 0, zero.data(), "a.bin"); }, {"a.bin", "expert 0", "record header"});
  std::vector<uint8_t> bad = rec;
  bad[40] = 1;  // a reserved byte
  test::expect_error([&] { check_record_header(index, a, 2, bad.data(), "a.bin"); }, {"a.bin", "record_bytes"});

  // Version 1 has no header: its records start with gate's bytes and nothing is checked.
  const ExpertLayer v1 = plan_expert_layer("model.layers.0.mlp", "f", 3, spec, 1);
  EXPECT_EQ(v1.header_bytes, 0u);
  EXPECT_EQ(v1.proj[0].q_offset, 0u);
  EXPECT_EQ(v1.record_bytes + kRecordHeaderBytes, a.record_bytes);
  EXPECT_NO_THROW(check_record_header(index, v1, 1, zero.data(), "v1.bin"));
}

TEST(EngineDir, Version1IndexIsStillRead) {
  const ModelConfig cfg = tiny_config();
  const std::string dir = test::scratch_dir("engine-v1");
  fs::create_directory(dir + "/experts");
  ExpertLayer l = plan_expert_layer("model.layers.0.mlp", "experts/layer_000.bin", 3, specs(4, 4, 4, 64), 1);
  std::vector<uint8_t> blob(3 * l.stride, 7);
  for (int e = 0; e < 3; ++e) l.checksums.push_back(record_checksum(l, blob.data() + size_t(e) * l.stride));
  std::ofstream(dir + "/" + l.file, std::ios::binary).write(reinterpret_cast<const char*>(blob.data()), std::streamsize(blob.size()));
  EngineIndex index{cfg.architecture, 8, 64, {l}};
  index.version = 1;
  const std::string text = engine_index_json(index, cfg);
  EXPECT_EQ(text.find("header_bytes"), std::string::npos);  // version 1 is written as it was
  EXPECT_EQ(text.find("checksums\": {"), std::string::npos);
  std::ofstream(dir + "/moestream.json") << text;
  const EngineIndex read = read_engine_index(dir, cfg);
  EXPECT_EQ(read.version, 1);
  EXPECT_EQ(engine_index_json(read, cfg), text);
  ExpertBlobs blobs(dir, read);
  blobs.verify(blobs.index().layers[0], 2);
}

// ---- dense.safetensors checksums (version 2) ----

TEST(EngineDir, DenseChecksumsCatchEveryChangeNamingTheTensor) {
  const ModelConfig cfg = tiny_config();
  const std::string dir = write_dir(cfg);
  std::vector<float> a(256, 1.5f), b(64, -2.f);
  const std::string dense = dir + "/dense.safetensors";
  write_safetensors(dense, {make_f32_tensor("model.norm.weight", {256}, a.data()), make_f32_tensor("w.b", {64}, b.data())});
  EngineIndex index = read_engine_index(dir, cfg);
  index.dense_checksums = dense_checksums(dense, index.version);
  ASSERT_EQ(index.dense_checksums.tensors.size(), 2u);
  std::ofstream(dir + "/moestream.json") << engine_index_json(index, cfg);
  const EngineIndex read = read_engine_index(dir, cfg);
  EXPECT_EQ(read.dense_checksums.tensors, index.dense_checksums.tensors);
  EXPECT_EQ(read.dense_checksums.header, index.dense_checksums.header);
  // What a load checks (the file as open) agrees with what convert stored (read in pieces).
  const DenseChecksums loaded = dense_checksums(SafetensorsFile(dense, Residence::Memory), index.version);
  EXPECT_EQ(loaded.header, index.dense_checksums.header);
  EXPECT_EQ(loaded.tensors, index.dense_checksums.tensors);
  auto verify_dense_file = [&] { verify_dense(SafetensorsFile(dense), read); };
  EXPECT_NO_THROW(verify_dense_file());

  const std::string good = [&] {
    std::ifstream in(dense, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const size_t data = SafetensorsFile(dense).data_begin();
  auto corrupt = [&](size_t at, char v) {
    std::string bytes = good;
    bytes[at] = v;
    std::ofstream(dense, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  };
  corrupt(data + 4 * 10, 0x55);  // inside model.norm.weight (sorted first in the header)
  test::expect_error(verify_dense_file, {"dense.safetensors", "'model.norm.weight'", "checksum"});
  corrupt(good.size() - 1, 0x55);  // the last byte of w.b
  test::expect_error(verify_dense_file, {"dense.safetensors", "'w.b'", "checksum"});
  corrupt(good.find("\"F32\"", good.find("w.b")) + 1, 'I');  // w.b as I32: the same bytes, other values
  test::expect_error(verify_dense_file, {"dense.safetensors", "header checksum"});
  write_safetensors(dense, {make_f32_tensor("model.norm.weight", {256}, a.data())});
  test::expect_error(verify_dense_file, {"dense.safetensors", "header checksum"});
}

}  // namespace
}  // namespace ms
