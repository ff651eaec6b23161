// The command line as later tooling calls it: help, argument errors (exit 2, one line),
// logits / generate / inspect against the fixtures' transformers references, load errors (exit 1).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "format/safetensors.h"
#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::run_cli;

std::vector<int64_t> ids_of(const TensorView& t) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < t.numel(); ++i) ids.push_back(t.dtype == DType::I64 ? t.as<int64_t>()[i] : t.as<int32_t>()[i]);
  return ids;
}

std::string join(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

float max_abs_diff(const TensorView& got, const TensorView& want) {
  EXPECT_EQ(got.shape, want.shape) << got.name;
  if (got.shape != want.shape) return INFINITY;
  float m = 0.f;
  for (int64_t i = 0; i < got.numel(); ++i) m = std::max(m, std::abs(got.as<float>()[i] - want.as<float>()[i]));
  return m;
}

// ---- help and argument errors ----

TEST(Cli, HelpExitsZero) {
  std::string out, err;
  EXPECT_EQ(run_cli("--help", &out, &err), 0) << err;
  for (const char* cmd : {"logits", "generate", "inspect"}) EXPECT_NE(out.find(cmd), std::string::npos) << out;
  for (const char* cmd : {"logits", "generate", "inspect"}) {
    SCOPED_TRACE(cmd);
    EXPECT_EQ(run_cli(std::string(cmd) + " --help", &out, &err), 0) << err;
    EXPECT_NE(out.find("--model"), std::string::npos) << out;
  }
  EXPECT_EQ(run_cli("--help-all", &out, &err), 0) << err;
}

// Wrong arguments: exit 2 and one line on stderr that mentions `reason`.
void expect_usage_error(const std::string& args, const std::string& reason) {
  SCOPED_TRACE(args);
  std::string out, err;
  EXPECT_EQ(run_cli(args, &out, &err), 2) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find(reason), std::string::npos) << err;
  EXPECT_TRUE(out.empty()) << out;
}

TEST(Cli, WrongArgumentsExitTwoWithOneLine) {
  // A model directory that exists, so nothing but the arguments can be at fault.
  const std::string m = "--model " + test::scratch_dir("cli-args");
  expect_usage_error("", "command is required");
  expect_usage_error("frobnicate", "frobnicate");
  expect_usage_error("logits " + m + " --ids 3,4 --out x.safetensors --bogus", "--bogus");
  expect_usage_error("generate --ids 3,4", "--model");
  expect_usage_error("inspect", "--model");
  expect_usage_error("logits " + m + " --out x.safetensors", "--ids");
  expect_usage_error("logits " + m + " --ids 3,x,5 --out x.safetensors", "'x'");
  expect_usage_error("generate " + m + " --ids 3,x,5", "'x'");
  expect_usage_error("generate " + m + " --ids 3,,5", "--ids");
  expect_usage_error("generate " + m + " --ids -3", "--ids");
  expect_usage_error("generate " + m + " --ids 3 --max-tokens -1", "--max-tokens: -1 is outside [1, ");
  expect_usage_error("generate " + m + " --ids 3 --max-tokens 0", "--max-tokens");
  expect_usage_error("generate " + m + " --ids 3 --max-tokens many", "--max-tokens");
  expect_usage_error("logits " + m + " --ids 3,4 --out x.safetensors --mtp-hidden middle", "--mtp-hidden");
}

// --kv-bits shrinks the KV the memory plan counts: a context whose float32 KV does not fit in a
// budget runs there at K4/V3 (pycoder: 3 KiB a position in float32, 384 bytes at K4/V3).
TEST(Cli, KvBitsFitAContextFloat32KvDoesNot) {
  const std::string cmd = "generate --model " MOESTREAM_SOURCE_DIR
                          "/models/pycoder-moe-q4 --ids 1,2,3 --max-tokens 4 --memory 100M --context 100000";
  std::string out, err;
  EXPECT_EQ(run_cli(cmd, &out, &err), 1);
  EXPECT_NE(err.find("KV/state for 100000 tokens 293.4 MiB"), std::string::npos) << err;
  EXPECT_EQ(run_cli(cmd + " --kv-bits 4,3 --stats", &out, &err), 0) << err;
  EXPECT_NE(err.find("KV cache: K4/V3 g64 hadamard, 0.4 KiB a position (float32: 3.0 KiB)"), std::string::npos) << err;
  EXPECT_NE(err.find("KV/state 37.0 MiB"), std::string::npos) << err;
}

TEST(Cli, MissingModelDirExitsOneNamingIt) {
  const std::string dir = test::scratch_dir("cli-nomodel") + "/no-such-model";
  for (const std::string& cmd : {"inspect --model " + dir, "generate --ids 3 --model " + dir,
                                "logits --ids 3 --out " + dir + ".safetensors --model " + dir}) {
    SCOPED_TRACE(cmd);
    std::string out, err;
    EXPECT_EQ(run_cli(cmd, &out, &err), 1) << err;
    EXPECT_NE(err.find(dir), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

// ---- the commands against the fixtures' references ----

TEST(Cli, LogitsMatchReference) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", model);
  TensorStore ref = TensorStore::open(model + "/reference.safetensors");
  const std::vector<int64_t> ids = ids_of(ref.get("p0.input_ids"));
  const std::string out_file = test::scratch_dir("cli-logits") + "/logits.safetensors";
  std::string out, err;
  ASSERT_EQ(run_cli("logits --model " + model + " --ids " + join(ids) + " --out " + out_file, &out, &err), 0) << err;
  TensorStore got = TensorStore::open(out_file);
  EXPECT_EQ(got.names(), std::vector<std::string>{"logits"});
  const TensorView& logits = got.get("logits");
  logits.expect(DType::F32, {int64_t(ids.size()), 1024});
  const float e = max_abs_diff(logits, ref.get("p0.logits"));
  std::printf("cli logits: max |logit - reference| = %.3g\n", e);
  EXPECT_LE(e, 1e-3f);
}

TEST(Cli, MtpLogitsMatchReference) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", model);
  TensorStore ref = TensorStore::open(model + "/reference.safetensors");
  const std::vector<int64_t> ids = ids_of(ref.get("p0.input_ids"));
  const int64_t T = int64_t(ids.size());
  for (const char* variant : {"pre", "post"}) {
    SCOPED_TRACE(variant);
    const std::string out_file = test::scratch_dir("cli-mtp") + "/logits.safetensors";
    // pre is the default; post must be asked for.
    const std::string flag = std::string(variant) == "pre" ? "" : " --mtp-hidden post";
    std::string out, err;
    ASSERT_EQ(run_cli("logits --model " + model + " --ids " + join(ids) + " --out " + out_file + " --mtp" + flag, &out, &err), 0)
        << err;
    TensorStore got = TensorStore::open(out_file);
    got.get("logits").expect(DType::F32, {T, 1024});
    got.get("mtp_logits").expect(DType::F32, {T - 1, 1024});
    EXPECT_LE(max_abs_diff(got.get("logits"), ref.get("p0.logits")), 1e-3f);
    const float e = max_abs_diff(got.get("mtp_logits"), ref.get(std::string("p0.mtp_logits_") + variant + "_norm_hidden"));
    std::printf("cli mtp logits (%s-norm hidden): max |logit - reference| = %.3g\n", variant, e);
    EXPECT_LE(e, 1e-3f);
  }
}

TEST(Cli, MtpOnModelWithoutMtpHeadFails) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", model);
  const std::string out_file = test::scratch_dir("cli-nomtp") + "/logits.safetensors";
  std::string out, err;
  EXPECT_EQ(run_cli("logits --model " + model + " --ids 3,4 --out " + out_file + " --mtp", &out, &err), 1);
  EXPECT_NE(err.find("MTP"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out_file));
}

TEST(Cli, GenerateMatchesReferenceGreedy) {
  for (const char* fixture : {"qwen3-moe-tiny", "qwen3-next-tiny"}) {
    SCOPED_TRACE(fixture);
    MS_REQUIRE_SHARED(std::string("fixtures/") + fixture, model);
    TensorStore ref = TensorStore::open(model + "/reference.safetensors");
    std::string out, err;
    ASSERT_EQ(run_cli("generate --model " + model + " --ids " + join(ids_of(ref.get("p0.input_ids"))) +
                          " --max-tokens 24 --ignore-eos",
                      &out, &err),
              0)
        << err;
    EXPECT_EQ(out, join(ids_of(ref.get("p0.greedy"))) + "\n");
  }
}

// With a GPU (and a CUDA build) --device cuda gives the reference's greedy tokens; without,
// it fails in one line naming the option.
TEST(Cli, DeviceCudaRunsOrSaysWhyNot) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", model);
  TensorStore ref = TensorStore::open(model + "/reference.safetensors");
  std::string out, err;
  const int rc = run_cli("generate --device cuda --model " + model + " --ids " + join(ids_of(ref.get("p0.input_ids"))) +
                             " --max-tokens 24 --ignore-eos",
                         &out, &err);
  if (rc == 0) {
    EXPECT_EQ(out, join(ids_of(ref.get("p0.greedy"))) + "\n");
  } else {
    EXPECT_EQ(rc, 1) << err;
    EXPECT_NE(err.find("--device cuda"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  EXPECT_EQ(run_cli("generate --device tpu --model " + model + " --ids 3", &out, &err), 2);
  EXPECT_NE(err.find("--device"), std::string::npos) << err;
}

// The GPU's tiers are sized only for the GPU, with a size that parses.
TEST(Cli, VramAndHostCacheNeedDeviceCuda) {
  const std::string model = std::string(" --model ") + MOESTREAM_SOURCE_DIR + "/models/pycoder-moe-q4";
  std::string out, err;
  EXPECT_EQ(run_cli("generate --vram 8G --ids 3" + model, &out, &err), 1);
  EXPECT_NE(err.find("--vram and --host-cache"), std::string::npos) << err;
  EXPECT_NE(err.find("--device cuda"), std::string::npos) << err;
  EXPECT_EQ(run_cli("generate --device cuda --host-cache 8Q --ids 3" + model, &out, &err), 2);  // refused with the flags
  EXPECT_NE(err.find("8Q"), std::string::npos) << err;
  EXPECT_EQ(run_cli("generate --device cuda --host-policy mru --ids 3" + model, &out, &err), 2);
  EXPECT_NE(err.find("--host-policy"), std::string::npos) << err;
  // Where experts run beside the GPU is a GPU run's choice too.
  for (const char* flag : {" --cpu-experts auto", " --cpu-experts 2", " --h2d-rate 25G"}) {
    EXPECT_EQ(run_cli(std::string("generate --device cpu --ids 3") + flag + model, &out, &err), 1) << flag;
    EXPECT_NE(err.find("--cpu-experts and --h2d-rate"), std::string::npos) << flag << ": " << err;
  }
}

TEST(Cli, GenerateRejectsTokenOutsideVocabulary) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", model);
  std::string out, err;
  EXPECT_EQ(run_cli("generate --model " + model + " --ids 3,1024", &out, &err), 1);
  EXPECT_NE(err.find("1024"), std::string::npos) << err;
  EXPECT_NE(err.find("vocabulary"), std::string::npos) << err;
}

// Parameter counts straight from the checkpoint: routed expert tensors vs everything else.
struct Counts {
  int64_t dense = 0, experts = 0;
};
Counts count_params(const std::string& model) {
  TensorStore s = TensorStore::open(model);
  Counts c;
  for (auto& name : s.names()) (name.find(".experts.") != std::string::npos ? c.experts : c.dense) += s.get(name).numel();
  return c;
}

TEST(Cli, InspectPrintsArchitectureAndParameters) {
  struct Case {
    const char* fixture;
    const char* arch;
    const char* layers;
    const char* mtp;
  };
  for (const Case& k : {Case{"qwen3-moe-tiny", "Qwen3MoeForCausalLM", "4 [full full full full]", "no"},
                        Case{"qwen3-next-tiny", "Qwen3NextForCausalLM",
                             "8 [linear linear linear full linear linear linear full]", "yes"}}) {
    SCOPED_TRACE(k.fixture);
    MS_REQUIRE_SHARED(std::string("fixtures/") + k.fixture, model);
    std::string out, err;
    ASSERT_EQ(run_cli("inspect --model " + model, &out, &err), 0) << err;
    EXPECT_NE(out.find(std::string("architecture   ") + k.arch + "\n"), std::string::npos) << out;
    EXPECT_NE(out.find(std::string("layers         ") + k.layers + "\n"), std::string::npos) << out;
    EXPECT_NE(out.find(std::string("mtp head       ") + k.mtp + "\n"), std::string::npos) << out;
    const Counts c = count_params(model);
    EXPECT_GT(c.experts, c.dense);
    EXPECT_NE(out.find(fmt::format("dense {} (", c.dense)), std::string::npos) << out;
    EXPECT_NE(out.find(fmt::format("experts {} (", c.experts)), std::string::npos) << out;
    EXPECT_NE(out.find(fmt::format("total {}\n", c.dense + c.experts)), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace ms
