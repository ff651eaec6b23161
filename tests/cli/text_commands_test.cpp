// run and chat end to end on pycoder-moe through the built binary.
#include <gtest/gtest.h>

#include <fstream>

#include "runtime/session.h"
#include "test_support.h"

namespace ms {
namespace {

TEST(RunCommand, StreamsTheGreedyCompletion) {
  MS_REQUIRE_SHARED("models/pycoder-moe", dir);
  std::string out, err;
  ASSERT_EQ(test::run_cli("run --model " + dir + " --prompt 'def square(x):' --max-tokens 20 --ignore-eos --stats", &out, &err), 0)
      << err;
  auto engine = Engine::load(dir);
  Session s(*engine);
  GenerationRequest req;
  req.prompt = engine->tokenizer().encode("def square(x):");
  req.max_tokens = 20;
  req.ignore_eos = true;
  EXPECT_EQ(out, s.generate(req).text + "\n");
  EXPECT_NE(err.find("decode"), std::string::npos) << "--stats prints decode tok/s";
  EXPECT_NE(err.find("first token"), std::string::npos);
}

TEST(RunCommand, ChatTemplateAndBadSamplingFlags) {
  MS_REQUIRE_SHARED("models/pycoder-moe", dir);
  std::string out, err;
  EXPECT_EQ(test::run_cli("run --model " + dir + " --prompt hi --chat --max-tokens 5 --temperature 0.7 --seed 1", &out, &err), 0) << err;
  EXPECT_EQ(test::run_cli("run --model " + dir + " --prompt hi --top-p 3", &out, &err), 2);
  EXPECT_EQ(test::run_cli("run --model " + dir + " --prompt hi --temperature -1", &out, &err), 2);
}

TEST(ChatCommand, KeepsTheConversationAcrossTurns) {
  MS_REQUIRE_SHARED("models/pycoder-moe", dir);
  const std::string input = test::scratch_dir("chat") + "/input.txt";
  std::ofstream(input) << "write a function\nnow test it\n/exit\n";
  std::string out, err;
  ASSERT_EQ(test::run_cli("chat --model " + dir + " --max-tokens 8 --stats", &out, &err, input), 0) << err;
  // Two turns answered; the second reused the first turn's cache.
  size_t first = err.find("reused"), second = err.find("reused", first + 1);
  ASSERT_NE(second, std::string::npos) << err;
  EXPECT_EQ(err.find("(0 reused)", first + 1), std::string::npos) << err;
}

}  // namespace
}  // namespace ms
