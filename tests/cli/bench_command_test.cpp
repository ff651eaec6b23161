// bench through the built binary: the bound, each test's row, and bad flags refused.
#include <gtest/gtest.h>

#include <regex>

#include "test_support.h"

namespace ms {
namespace {

TEST(BenchCommand, TimesPromptsAndDecodeBesideTheMemoryBound) {
  std::string out, err;
  ASSERT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --prompt 16,32 --tokens 4 --repeat 1",
                          &out, &err),
            0)
      << err;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(memory: read [0-9.]+ GB/s \([0-9]+ threads)"))) << out;
  EXPECT_NE(out.find("every routed expert read into its pool at load"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\npp16 +[0-9.]+\n)"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\npp32 +[0-9.]+\n)"))) << out;
  // tok/s, GB/s of weights read, and that against the measured read bandwidth.
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(\ntg4 +[0-9.]+ +[0-9.]+ +0\.[0-9]+\n)"))) << out;
}

TEST(BenchCommand, StreamingPoolsAreSaidToStream) {
  std::string out, err;
  ASSERT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --expert-slots 16 --prompt 0 "
                          "--tokens 2 --repeat 1",
                          &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("the pools cannot hold every expert: decode streams them"), std::string::npos) << out;
  EXPECT_EQ(out.find("\npp"), std::string::npos) << out;
}

TEST(BenchCommand, BadFlagsAreRefused) {
  std::string out, err;
  EXPECT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --repeat 0", &out, &err), 2);
  EXPECT_NE(err.find("--repeat"), std::string::npos) << err;
  EXPECT_EQ(test::run_cli("bench --model " MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4 --prompt 16,x", &out, &err), 2);
  EXPECT_EQ(test::run_cli("bench --model /nonexistent", &out, &err), 1);
  EXPECT_NE(err.find("/nonexistent"), std::string::npos) << err;
}

}  // namespace
}  // namespace ms
