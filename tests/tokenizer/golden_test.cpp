// Exactness against Hugging Face `tokenizers`: every case of ../shared/tokenizers/golden.json,
// for every tokenizer in it, must encode to the same ids and decode to the same text.
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;

json read_golden(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(TokenizerGolden, EncodeAndDecodeMatchHuggingFace) {
  MS_REQUIRE_SHARED("tokenizers/golden.json", golden_path);
  json golden = read_golden(golden_path);
  ASSERT_FALSE(golden["tokenizers"].empty());
  for (const auto& [rel, cases] : golden["tokenizers"].items()) {
    MS_REQUIRE_SHARED(rel, tok_path);
    ms::Tokenizer tok = ms::Tokenizer::load(tok_path);
    ASSERT_FALSE(cases.empty()) << rel;
    for (size_t i = 0; i < cases.size(); ++i) {
      const json& c = cases[i];
      const auto text = c["text"].get<std::string>();
      const auto ids = c["ids"].get<std::vector<int>>();
      SCOPED_TRACE(rel + " case " + std::to_string(i) + ": " + text);
      EXPECT_EQ(tok.encode(text), ids);
      EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>());
    }
  }
}

}  // namespace
