#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tool_calls.h"
#include "util/error.h"

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


// pycoder-moe ships Qwen3's template with its own eos token; the expected text is Jinja2 3.1.6's
// rendering of this conversation (system prompt, tools, reasoning, string and object arguments,
// consecutive tool responses, enable_thinking passed explicitly).
TEST(ChatTemplate, PycoderConversationWithToolsAndReasoning) {
  MS_REQUIRE_SHARED("models/pycoder-moe/tokenizer_config.json", config);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(config);
  EXPECT_EQ(tmpl.special_tokens().value("eos_token", ""), "<|endoftext|>");
  EXPECT_FALSE(tmpl.special_tokens().contains("bos_token"));  // null in the config
  json messages = json::parse(R"JSON([{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list"}, {"role": "assistant", "content": "Use sorted().", "reasoning_content": "Easy one."}, {"role": "user", "content": "Read data.txt first"}, {"role": "assistant", "content": "Reading it.", "reasoning_content": "Need the file.", "tool_calls": [{"type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"data.txt\"}"}}, {"type": "function", "function": {"name": "stat", "arguments": {"path": "data.txt", "follow": true}}}]}, {"role": "tool", "content": "3\n1\n2"}, {"role": "tool", "content": "{\"size\": 6}"}])JSON");
  json tools = json::parse(R"JSON([{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])JSON");
  std::string expected = R"(<|im_start|>system
You write Python.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Sort a list<|im_end|>
<|im_start|>assistant
Use sorted().<|im_end|>
<|im_start|>user
Read data.txt first<|im_end|>
<|im_start|>assistant
<think>
Need the file.
</think>

Reading it.
<tool_call>
{"name": "read_file", "arguments": {"path": "data.txt"}}
</tool_call>
<tool_call>
{"name": "stat", "arguments": {"path": "data.txt", "follow": true}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
3
1
2
</tool_response>
<tool_response>
{"size": 6}
</tool_response><|im_end|>
<|im_start|>assistant
)";
  EXPECT_EQ(tmpl.render(messages, tools, true, {{"enable_thinking", true}}), expected);
}

TEST(ChatTemplate, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  std::string dir = test::scratch_dir("chat_named");
  std::string path = dir + "/tokenizer_config.json";
  {
    std::ofstream out(path);
    out << json{{"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}},
                {"eos_token", "</s>"},
                {"chat_template", json::array({{{"name", "default"}, {"template", "{{ bos_token }}D{{ messages|length }}{{ eos_token }}"}},
                                               {{"name", "tool_use"}, {"template", "T{{ tools|length }}"}}})}}
               .dump();
  }
  ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(path);
  json messages = json::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(tmpl.render(messages, nullptr, false, json::object()), "<s>D1</s>");
  EXPECT_EQ(tmpl.render(messages, json::array({json::object()}), false, json::object()), "T1");
}

TEST(ChatTemplate, DeeplyNestedConfigIsAnErrorNotACrash) {
  const std::string path = test::scratch_dir("chat_deep") + "/tokenizer_config.json";
  for (size_t depth : {300, 300000}) {
    std::ofstream(path) << "{\"chat_template\": \"x\", \"extra\": " << std::string(depth, '[') << std::string(depth, ']') << "}";
    test::expect_error([&] { ChatTemplate::from_tokenizer_config(path); }, {path, "deeper than"});
  }
}

TEST(ChatTemplate, ErrorsNameTheConfigFile) {
  std::string dir = test::scratch_dir("chat_errors");
  std::string path = dir + "/tokenizer_config.json";
  std::ofstream(path) << R"({"chat_template": "{% for m in messages %}\n{{ m | nope }}{% endfor %}"})";
  try {
    ChatTemplate::from_tokenizer_config(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": chat template line 2: unknown filter 'nope'");
  }
  std::ofstream(path) << R"({"eos_token": "x"})";
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(path), Error);
}

// What the template writes for an assistant turn, the tool-call parser reads back.
TEST(ChatTemplate, RenderedToolCallsParseBack) {
  MS_REQUIRE_SHARED("tokenizers/qwen3/tokenizer_config.json", config);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(config);
  json messages = json::parse(R"([{"role": "user", "content": "q"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
      {"type": "function", "function": {"name": "a", "arguments": {"x": 1, "b": [true, null]}}},
      {"type": "function", "function": {"name": "b", "arguments": {}}}]},
    {"role": "tool", "content": "r"}])");
  std::string text = tmpl.render(messages, nullptr, false, json::object());
  std::string start = "<|im_start|>assistant\n", end = "<|im_end|>";
  size_t from = text.find(start) + start.size();
  ToolCallOutput parsed = parse_tool_calls(text.substr(from, text.find(end, from) - from));
  EXPECT_EQ(parsed.content, "Let me check.");
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].name, "a");
  EXPECT_EQ(parsed.calls[0].arguments.dump(), R"({"x":1,"b":[true,null]})");
  EXPECT_EQ(parsed.calls[1].name, "b");
  EXPECT_EQ(parsed.calls[1].arguments, json::object());
}

}  // namespace
}  // namespace ms
