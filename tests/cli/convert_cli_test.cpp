// `moestream convert` on the command line: a converted fixture runs through `logits` with the
// checkpoint's exact output, flag errors exit 2, conversion errors exit 1 naming the cause,
// and no progress bar is drawn when stderr is not a terminal.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_support.h"
#include "writers/convert.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::run_cli;

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ConvertCli, ConvertedFixtureGivesTheCheckpointsLogits) {
  MS_REQUIRE_SHARED("fixtures/qwen3-next-tiny", dir);
  const std::string work = test::scratch_dir("convert-cli");
  std::string out, err;
  ASSERT_EQ(run_cli("convert --from " + dir + " --out " + work + "/m --expert-bits 16", &out, &err), 0) << err;
  EXPECT_EQ(err, "");  // stderr is a file here: no progress bar
  EXPECT_NE(out.find(work + "/m"), std::string::npos) << out;
  const std::string ids = "--ids 1,7,300,42,5";
  ASSERT_EQ(run_cli("logits --model " + dir + " " + ids + " --mtp --out " + work + "/a.safetensors", nullptr, &err), 0) << err;
  ASSERT_EQ(run_cli("logits --model " + work + "/m " + ids + " --mtp --out " + work + "/b.safetensors", nullptr, &err), 0) << err;
  EXPECT_EQ(slurp(work + "/a.safetensors"), slurp(work + "/b.safetensors"));

  EXPECT_EQ(run_cli("convert --from " + dir + " --out " + work + "/m", nullptr, &err), 1);
  EXPECT_NE(err.find("already exists"), std::string::npos) << err;
  EXPECT_EQ(run_cli("convert --from " + dir + " --out " + work + "/m --expert-bits 4 --dense-bits 8 --proj-bits down=8 "
                    "--layer-bits 0:2,mtp:3 --force",
                    nullptr, &err),
            0)
      << err;
  EXPECT_EQ(run_cli("inspect --model " + work + "/m", &out, &err), 0) << err;
  EXPECT_NE(out.find("mtp head       yes"), std::string::npos) << out;
  EXPECT_NE(out.find("format         engine directory, version 3\n"), std::string::npos) << out;
  // A version-1 directory (older conversions) is read as it is; inspect says what the checks
  // cannot cover there, and a run notes that its dense weights are unchecked.
  ConvertOptions v1;
  v1.from = dir, v1.out = work + "/v1", v1.expert_bits = 4, v1.format_version = 1;
  convert_checkpoint(v1);
  EXPECT_EQ(run_cli("inspect --model " + work + "/v1", &out, &err), 0) << err;
  EXPECT_NE(out.find("version 1 (records without headers, no dense checksums"), std::string::npos) << out;
  EXPECT_EQ(run_cli("logits --model " + work + "/v1 " + ids + " --out " + work + "/d.safetensors", nullptr, &err), 0) << err;
  EXPECT_NE(err.find("note: " + work + "/v1 is engine format version 1: its dense weights carry no checksums and are not "
                     "checked"),
            std::string::npos)
      << err;
  // A version-2 directory (XXH64 checksums) is checked as it was written.
  ConvertOptions v2 = v1;
  v2.out = work + "/v2", v2.format_version = 2;
  convert_checkpoint(v2);
  EXPECT_EQ(run_cli("inspect --model " + work + "/v2", &out, &err), 0) << err;
  EXPECT_NE(out.find("format         engine directory, version 2\n"), std::string::npos) << out;
  test::flip_dense_tensor(work + "/v2", "model.norm.weight");
  EXPECT_EQ(run_cli("logits --model " + work + "/v2 " + ids + " --out " + work + "/e.safetensors", nullptr, &err), 1);
  EXPECT_NE(err.find(work + "/v2/dense.safetensors: tensor 'model.norm.weight': checksum"), std::string::npos) << err;
  // A converted directory's dense.safetensors is checked at load by default: a flipped byte is
  // named; --no-verify loads it.
  const std::string dense = work + "/m/dense.safetensors";
  std::string bytes = slurp(dense);
  bytes[bytes.size() - 3] ^= 0x20;
  std::ofstream(dense, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(run_cli("logits --model " + work + "/m " + ids + " --out " + work + "/c.safetensors", nullptr, &err), 1);
  EXPECT_NE(err.find("dense.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  EXPECT_EQ(run_cli("logits --model " + work + "/m " + ids + " --no-verify --out " + work + "/c.safetensors", nullptr, &err), 0)
      << err;
}

// An MLX directory or a GGUF file as --model: refused with the convert command, or converted
// once into --convert-to, whose later runs reuse it; `convert --from` takes both.
TEST(ConvertCli, MlxAndGgufModelsRunThroughConvertTo) {
  const test::MlxPair mlx = test::make_mlx("qwen3-moe-tiny", "default");
  if (mlx.mlx.empty()) GTEST_SKIP() << "../shared absent";
  const std::string work = test::scratch_dir("convert-cli-import");
  const std::string ids = "--ids 1,7,300,42,5";
  ASSERT_TRUE(test::make_gguf("model " + test::shared_path("fixtures/qwen3-moe-tiny") + " " + work + "/m.gguf Q8_0"));
  for (const std::string& src : {mlx.mlx, work + "/m.gguf"}) {
    const std::string dir = work + "/" + fs::path(src).filename().string() + ".engine";
    std::string out, err;
    EXPECT_EQ(run_cli("logits --model " + src + " " + ids + " --out " + work + "/x.safetensors", &out, &err), 1);
    EXPECT_NE(err.find("moestream convert --from " + src + " --out DIR"), std::string::npos) << err;
    EXPECT_NE(err.find("--convert-to"), std::string::npos) << err;
    ASSERT_EQ(run_cli("logits --model " + src + " --convert-to " + dir + " " + ids + " --out " + work + "/a.safetensors",
                      &out, &err),
              0)
        << err;
    EXPECT_NE(err.find("converting " + src), std::string::npos) << err;
    ASSERT_EQ(run_cli("logits --model " + src + " --convert-to " + dir + " " + ids + " --out " + work + "/b.safetensors",
                      &out, &err),
              0)
        << err;
    EXPECT_EQ(err.find("converting"), std::string::npos) << "the second run reuses " << dir << ": " << err;
    EXPECT_EQ(slurp(work + "/a.safetensors"), slurp(work + "/b.safetensors"));
    ASSERT_EQ(run_cli("convert --from " + src + " --out " + dir + ".2", &out, &err), 0) << err;
    ASSERT_EQ(run_cli("logits --model " + dir + ".2 " + ids + " --out " + work + "/c.safetensors", &out, &err), 0) << err;
    EXPECT_EQ(slurp(work + "/a.safetensors"), slurp(work + "/c.safetensors"));
  }
}

TEST(ConvertCli, FlagErrors) {
  std::string err;
  EXPECT_EQ(run_cli("convert --from a --out b --expert-bits 5", nullptr, &err), 2);
  EXPECT_NE(err.find("--expert-bits"), std::string::npos) << err;
  EXPECT_EQ(run_cli("convert --from a --out b --dense-bits 2", nullptr, &err), 2);
  EXPECT_NE(err.find("--dense-bits"), std::string::npos) << err;
  EXPECT_EQ(run_cli("convert --out b", nullptr, &err), 2);
  EXPECT_NE(err.find("--from"), std::string::npos) << err;
  const std::string work = test::scratch_dir("convert-cli-err");
  EXPECT_EQ(run_cli("convert --from " + work + "/nothing --out " + work + "/m", nullptr, &err), 1);
  EXPECT_NE(err.find("nothing"), std::string::npos) << err;
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  EXPECT_EQ(run_cli("convert --from " + dir + " --out " + work + "/m --proj-bits gate", nullptr, &err), 2);
  EXPECT_NE(err.find("--proj-bits"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(work + "/m"));
}

// With stderr on a terminal (a pseudo-terminal from util-linux `script`) the bar is drawn.
TEST(ConvertCli, ProgressBarOnATerminal) {
  MS_REQUIRE_SHARED("fixtures/qwen3-moe-tiny", dir);
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "util-linux 'script' not found";
  const std::string work = test::scratch_dir("convert-tty");
  const std::string cmd = std::string("script -qec '") + MOESTREAM_BINARY + " convert --from " + dir + " --out " + work +
                          "/m' /dev/null >" + work + "/tty.txt 2>&1 </dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string tty = slurp(work + "/tty.txt");
  EXPECT_NE(tty.find("100%"), std::string::npos) << tty;
  EXPECT_NE(tty.find("MB/s"), std::string::npos) << tty;
  EXPECT_NE(tty.find("ETA"), std::string::npos) << tty;
}

}  // namespace
}  // namespace ms
