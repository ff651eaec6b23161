// `moestream tokenize` / `detokenize` end to end through the built binary.
#include <fstream>

#include "test_support.h"

namespace {

std::string write_file(const std::string& content) {
  std::string path = ms::test::scratch_dir("cli-tok") + "/stdin";
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(CliTokenize, TextToIdsAndBack) {
  MS_REQUIRE_SHARED("tokenizers/qwen3", dir);
  const std::string text = "<|im_start|>user\nHi there<|im_end|>\n";
  std::string out, err;
  ASSERT_EQ(ms::test::run_cli("tokenize --model " + dir, &out, &err, write_file(text)), 0) << err;
  EXPECT_EQ(out, "[151644,872,198,13048,1052,151645,198]\n");

  ASSERT_EQ(ms::test::run_cli("detokenize --tokenizer " + dir + "/tokenizer.json", &out, &err,
                              write_file(out)),
            0)
      << err;
  EXPECT_EQ(out, text);
}

TEST(CliTokenize, PycoderModelDirectory) {
  MS_REQUIRE_SHARED("models/pycoder-moe", dir);
  std::string out, err;
  ASSERT_EQ(ms::test::run_cli("tokenize --model " + dir, &out, &err, write_file("")), 0) << err;
  EXPECT_EQ(out, "[]\n");
}

TEST(CliTokenize, Errors) {
  std::string out, err;
  EXPECT_EQ(ms::test::run_cli("tokenize", &out, &err), 2);  // neither --model nor --tokenizer
  EXPECT_NE(err.find("--model"), std::string::npos) << err;

  std::string missing = ms::test::scratch_dir("cli-tok");
  EXPECT_EQ(ms::test::run_cli("tokenize --model " + missing, &out, &err), 1);
  EXPECT_NE(err.find(missing + "/tokenizer.json"), std::string::npos) << err;

  MS_REQUIRE_SHARED("tokenizers/qwen3", dir);
  EXPECT_EQ(ms::test::run_cli("detokenize --model " + dir, &out, &err, write_file("{\"a\": 1}")), 1);
  EXPECT_NE(err.find("JSON array of token ids"), std::string::npos) << err;
  // Ids outside the vocabulary are errors naming the element, not text made of nothing.
  for (const char* ids : {"[1, 999999]", "[-1]", "[2147483648]", "[18446744073709551615]", "[1, 2, 151669000]"}) {
    SCOPED_TRACE(ids);
    EXPECT_EQ(ms::test::run_cli("detokenize --model " + dir, &out, &err, write_file(ids)), 1);
    EXPECT_NE(err.find("outside the vocabulary"), std::string::npos) << err;
    EXPECT_NE(err.find("element"), std::string::npos) << err;
  }
  EXPECT_EQ(ms::test::run_cli("detokenize --model " + dir, &out, &err, write_file("[9707, 1879]")), 0) << err;
}

}  // namespace
