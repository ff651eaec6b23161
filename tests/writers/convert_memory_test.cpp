// Converting in bounded memory: a multi-shard random-weight checkpoint several times larger
// than a cgroup v1 memory limit converts under that limit. Skips when no memory cgroup can be
// created (not root, cgroup v2 only, a container without the controller).
#include <fcntl.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/engine_dir.h"
#include "format/safetensors.h"
#include "backends/load.h"
#include "model/model.h"
#include "test_support.h"
#include "util/half.h"

namespace ms {
namespace {

namespace fs = std::filesystem;

constexpr size_t kLimit = size_t(64) << 20;

struct Dims {
  int hidden = 512, layers = 6, vocab = 2048, experts = 64, inter = 256, heads = 4, kv_heads = 2, head_dim = 64;
};

// Random bf16 weights (small uniform values), written piece by piece: the test itself stays
// small too.
void write_shard(const std::string& path, const std::vector<TensorSpec>& specs) {
  SafetensorsWriter w(path, specs);
  std::vector<uint16_t> buf(size_t(1) << 20);
  uint64_t state = std::hash<std::string>{}(path);
  for (size_t i = 0; i < specs.size(); ++i) {
    const size_t n = specs[i].nbytes() / 2;
    const bool norm = specs[i].shape.size() == 1;
    for (size_t done = 0; done < n; done += buf.size()) {
      const size_t k = std::min(buf.size(), n - done);
      for (size_t j = 0; j < k; ++j) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const float u = float(state >> 40) / float(1 << 24) - 0.5f;  // [-0.5, 0.5)
        buf[j] = f32_to_bf16(norm ? 1.0f + 0.1f * u : 0.05f * u);
      }
      w.write(i, done * 2, buf.data(), k * 2);
    }
  }
  w.close();
  // Out of the page cache, so that the converter's reads are charged to its own cgroup.
  const int fd = ::open(path.c_str(), O_RDONLY);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// A Qwen3-MoE checkpoint, one shard per decoder layer (plus one for embeddings and head).
size_t write_checkpoint(const std::string& dir, const std::string& base_config, const Dims& d) {
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(base_config));
  cfg["hidden_size"] = d.hidden, cfg["num_hidden_layers"] = d.layers, cfg["vocab_size"] = d.vocab;
  cfg["num_local_experts"] = d.experts, cfg["moe_intermediate_size"] = d.inter, cfg["num_attention_heads"] = d.heads;
  cfg["num_key_value_heads"] = d.kv_heads, cfg["head_dim"] = d.head_dim;
  std::ofstream(dir + "/config.json") << cfg.dump(1);
  const int64_t H = d.hidden, I = d.inter, QD = d.heads * d.head_dim, KD = d.kv_heads * d.head_dim;
  nlohmann::json index;
  size_t bytes = 0;
  auto shard = [&](const std::string& file, const std::vector<TensorSpec>& specs) {
    for (auto& s : specs) {
      index["weight_map"][s.name] = file;
      bytes += s.nbytes();
    }
    write_shard(dir + "/" + file, specs);
  };
  shard("model-head.safetensors", {{"model.embed_tokens.weight", DType::BF16, {d.vocab, H}},
                                   {"model.norm.weight", DType::BF16, {H}},
                                   {"lm_head.weight", DType::BF16, {d.vocab, H}}});
  for (int l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    std::vector<TensorSpec> s = {{p + ".input_layernorm.weight", DType::BF16, {H}},
                                 {p + ".post_attention_layernorm.weight", DType::BF16, {H}},
                                 {p + ".self_attn.q_proj.weight", DType::BF16, {QD, H}},
                                 {p + ".self_attn.k_proj.weight", DType::BF16, {KD, H}},
                                 {p + ".self_attn.v_proj.weight", DType::BF16, {KD, H}},
                                 {p + ".self_attn.o_proj.weight", DType::BF16, {H, QD}},
                                 {p + ".self_attn.q_norm.weight", DType::BF16, {d.head_dim}},
                                 {p + ".self_attn.k_norm.weight", DType::BF16, {d.head_dim}},
                                 {p + ".mlp.gate.weight", DType::BF16, {d.experts, H}}};
    for (int e = 0; e < d.experts; ++e) {
      const std::string x = p + ".mlp.experts." + std::to_string(e);
      s.push_back({x + ".gate_proj.weight", DType::BF16, {I, H}});
      s.push_back({x + ".up_proj.weight", DType::BF16, {I, H}});
      s.push_back({x + ".down_proj.weight", DType::BF16, {H, I}});
    }
    shard("model-layer" + std::to_string(l) + ".safetensors", s);
  }
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(1);
  return bytes;
}

TEST(ConvertMemory, CheckpointLargerThanCgroupLimitConverts) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny/config.json", base_config);
  test::MemoryCgroup cg(kLimit);
  if (cg.path().empty()) GTEST_SKIP() << "cannot create a memory cgroup under /sys/fs/cgroup/memory (needs cgroup v1 and root)";
  const std::string src = test::scratch_dir("bigckpt"), out = test::scratch_dir("bigckpt-out") + "/model";
  const size_t bytes = write_checkpoint(src, base_config, Dims{});
  ASSERT_GE(bytes, 4 * kLimit);

  const test::CgroupRun run = test::run_cli_in_cgroup(cg, "convert --from " + src + " --out " + out + " --expert-bits 4");
  const size_t peak = cg.read("memory.max_usage_in_bytes");
  std::printf("converted %.0f MB of tensors under a %.0f MB cgroup limit: exit %d, cgroup peak %.1f MB (page cache "
              "included), converter peak RSS %.1f MB\n",
              double(bytes) / 1e6, double(kLimit) / 1e6, run.rc, double(peak) / 1e6, double(run.peak_rss_bytes) / 1e6);
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_LE(peak, kLimit);

  auto model = load_model(out);
  ExpertBlobs blobs(out, read_engine_index(out, model->config()));
  for (auto& l : blobs.index().layers)
    for (int e = 0; e < l.n_experts; ++e) blobs.verify(l, e);
  std::vector<int> ids{1, 2, 3};
  State s = model->new_state();
  for (float v : model->forward(ids.data(), 3, s).logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace ms
