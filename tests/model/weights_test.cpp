// The loader against what config.json claims: a num_hidden_layers that disagrees with the
// checkpoint's or the engine directory's layers, in either direction, is refused naming the
// tensor; and the load holds the dense weights to the checksums convert and synth stored.
#include "model/weights.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/engine_dir.h"
#include "backends/load.h"
#include "model/model.h"
#include "writers/synth.h"
#include "synth_support.h"
#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::synth_tiny;
using json = nlohmann::json;
using test::expect_error;

json read_json(const std::string& path) { return json::parse(std::ifstream(path)); }

// The qwen3-moe-tiny checkpoint with config.json's num_hidden_layers set to `layers`.
std::string checkpoint_with_layers(const std::string& src, int layers) {
  const std::string dir = test::scratch_dir("layers");
  fs::create_symlink(src + "/model.safetensors", dir + "/model.safetensors");
  json cfg = read_json(src + "/config.json");
  cfg["num_hidden_layers"] = layers;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  return dir;
}

TEST(Weights, NumHiddenLayersMustMatchTheCheckpoint) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", src);
  const int n = read_json(src + "/config.json")["num_hidden_layers"];
  ASSERT_GE(n, 2);
  EXPECT_NO_THROW(load_model(checkpoint_with_layers(src, n)));
  // Smaller: the model would run truncated, silently. Every smaller count is refused.
  for (int layers : {n - 1, 1}) {
    SCOPED_TRACE(layers);
    const std::string dir = checkpoint_with_layers(src, layers);
    expect_error([&] { load_model(dir); },
                 {"model.safetensors", "'model.layers." + std::to_string(layers) + ".", "num_hidden_layers is " + std::to_string(layers)});
  }
  // Larger: the first layer the checkpoint lacks is named.
  const std::string dir = checkpoint_with_layers(src, n + 1);
  expect_error([&] { load_model(dir); }, {"missing tensor", "'model.layers." + std::to_string(n) + "."});
}

// The engine directory's config.json and index edited together to 3 of its 4 layers.
void claim_three_layers(const std::string& dir, bool drop_index_layer) {
  json cfg = read_json(dir + "/config.json");
  cfg["num_hidden_layers"] = 3;
  if (cfg.contains("layer_types")) cfg["layer_types"].erase(3);
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  json index = read_json(dir + "/moestream.json");
  index["dims"]["num_hidden_layers"] = 3;
  if (drop_index_layer) index["expert_layers"].erase(3);
  std::ofstream(dir + "/moestream.json") << index.dump(1);
}

TEST(Weights, NumHiddenLayersMustMatchTheEngineDirectory) {
  const std::string dir = synth_tiny("engine-layers", 11);
  EXPECT_NO_THROW(load_model(dir));
  claim_three_layers(dir, false);
  expect_error([&] { load_model(dir); }, {"moestream.json", "model.layers.3.mlp", "num_hidden_layers 3"});
  claim_three_layers(dir, true);  // the index forged too: dense.safetensors still has layer 3
  expect_error([&] { load_model(dir); }, {"dense.safetensors", "'model.layers.3.", "num_hidden_layers is 3"});
}

TEST(Weights, VerifyCatchesCorruptDenseWeightsNamingTheTensor) {
  const std::string dir = synth_tiny("dense-verify", 11);
  EXPECT_NO_THROW(load_model(dir));
  const std::string dense = dir + "/" + kEngineDenseFile;
  std::string name;
  size_t at = 0;
  {
    const SafetensorsFile f(dense);
    const TensorView& t = f.tensors().at("model.layers.1.input_layernorm.weight");
    name = t.name;
    at = size_t(static_cast<const uint8_t*>(t.data) - f.file_data()) + t.nbytes / 2;
  }
  {
    std::fstream f(dense, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(at));
    const char c = char(f.get());
    f.seekp(std::streamoff(at));
    f.put(char(c ^ 0x40));
  }
  // By default the flipped weight is named; --no-verify loads it (and would compute with it).
  expect_error([&] { load_model(dir); }, {"dense.safetensors", "'" + name + "'", "checksum"});
  ModelOptions unchecked;
  unchecked.experts.verify = false;
  EXPECT_NO_THROW(load_model(dir, unchecked));
}

}  // namespace
}  // namespace ms
