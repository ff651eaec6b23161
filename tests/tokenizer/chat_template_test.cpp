#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/chat_template.h"

namespace ms {
namespace {

using json = nlohmann::ordered_json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Every case of the golden file, rendered by Jinja2 3.1.6 the way transformers configures it.
TEST(ChatTemplate, Qwen3GoldenCases) {
  MS_REQUIRE_SHARED("tokenizers/qwen3/tokenizer_config.json", config);
  MS_REQUIRE_SHARED("tokenizers/qwen3/chat_golden.json", golden_path);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(config);
  json golden = read_json(golden_path);
  ASSERT_FALSE(golden["cases"].empty());
  size_t i = 0;
  for (const auto& c : golden["cases"]) {
    const json& input = c["input"];
    json extra = json::object();
    for (const auto& [k, v] : input.items())
      if (k != "messages" && k != "tools" && k != "add_generation_prompt") extra[k] = v;
    std::string got = tmpl.render(input["messages"], input.value("tools", json()),
                                  input.value("add_generation_prompt", false), extra);
    EXPECT_EQ(got, c["rendered"].get<std::string>()) << "case " << i << ": " << input.dump();
    ++i;
  }
}

}  // namespace
}  // namespace ms
