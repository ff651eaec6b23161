// `moestream tokenize` / `detokenize` end to end through the built binary.
#include <algorithm>
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
  EXPECT_EQ(ms::test::run_cli("detokenize --model " + dir, &out, &err, write_file("[9707, 1879]")), 0) << err;
}

// An id the vocabulary does not have is an error naming it and the vocabulary's size.
TEST(CliTokenize, DetokenizeRefusesIdsOutsideTheVocabulary) {
  MS_REQUIRE_SHARED("tokenizers/qwen3", dir);
  const std::string cmd = "detokenize --tokenizer " + dir + "/tokenizer.json";
  for (const char* ids : {"[151669]", "[1, -1]", "[2147483648]", "[18446744073709551615]", "[872, 99999999999999]"}) {
    std::string out, err;
    EXPECT_EQ(ms::test::run_cli(cmd, &out, &err, write_file(ids)), 1) << ids;
    EXPECT_NE(err.find("is outside the vocabulary of 151669 ids (0 to 151668)"), std::string::npos) << ids << ": " << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;  // one line
    EXPECT_TRUE(out.empty()) << out;
  }
  std::string out, err;
  ASSERT_EQ(ms::test::run_cli(cmd, &out, &err, write_file("[151668]")), 0) << err;
  EXPECT_EQ(out, "</think>");
  EXPECT_EQ(ms::test::run_cli(cmd, &out, &err, write_file("[1.5]")), 1);
  EXPECT_NE(err.find("element 0 of the array is not an integer"), std::string::npos) << err;
}

}  // namespace
