// Model output → OpenAI chat message parts: `<tool_call>` blocks become `tool_calls`, whole
// and streamed, and the two forms agree.
#include "server/chat_output.h"

#include <gtest/gtest.h>

namespace ms {
namespace {

using json = nlohmann::ordered_json;

const std::string kOutput =
    "Let me check.\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";

std::function<std::string()> counting_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

TEST(ChatOutput, ToolCallsInWholeText) {
  std::string finish = "stop";
  json msg = chat_message(kOutput, true, &finish, counting_ids());
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"], "Let me check.");
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][0],
            json::parse(R"({"id": "call_0", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"days\":2}"}})"));
  EXPECT_EQ(msg["tool_calls"][1]["function"]["name"], "get_time");
  EXPECT_EQ(json::parse(msg["tool_calls"][1]["function"]["arguments"].get<std::string>()), json({{"tz", "CET"}}));
  EXPECT_EQ(finish, "tool_calls");
}

TEST(ChatOutput, OnlyToolCallsGiveNullContent) {
  std::string finish = "stop";
  json msg = chat_message("<tool_call>\n{\"name\": \"f\"}\n</tool_call>", true, &finish, counting_ids());
  EXPECT_TRUE(msg["content"].is_null());
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], "{}");
}

TEST(ChatOutput, CutOffAnswerKeepsItsFinishReason) {
  std::string finish = "length";
  json msg = chat_message(kOutput, true, &finish, counting_ids());
  EXPECT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(finish, "length");
}

TEST(ChatOutput, WithoutToolsTheTextIsContent) {
  std::string finish = "stop";
  json msg = chat_message(kOutput, false, &finish, counting_ids());
  EXPECT_EQ(msg["content"], kOutput);
  EXPECT_FALSE(msg.contains("tool_calls"));
  EXPECT_EQ(finish, "stop");
}

TEST(ChatOutput, MalformedCallStaysContent) {
  const std::string text = "x\n<tool_call>\nnot json\n</tool_call>";
  json msg = chat_message(text, true, nullptr, counting_ids());
  EXPECT_EQ(msg["content"], text);
  EXPECT_FALSE(msg.contains("tool_calls"));
}

// Streaming in pieces of every size gives the same content and calls as the whole text, each
// call in one delta with its index, and never shows a partial tag.
TEST(ChatOutput, StreamedDeltasMatchTheWholeText) {
  for (size_t step : {1, 2, 3, 7, 64, 1000}) {
    ChatDeltaStream stream(true, counting_ids());
    std::string content;
    json calls = json::array();
    auto take = [&](const std::vector<json>& deltas) {
      for (const json& d : deltas) {
        if (d.contains("content")) content += d["content"].get<std::string>();
        if (d.contains("tool_calls")) {
          ASSERT_EQ(d["tool_calls"].size(), 1u);
          const json& c = d["tool_calls"][0];
          EXPECT_EQ(c["index"], calls.size());
          calls.push_back({{"id", c["id"]}, {"type", c["type"]}, {"function", c["function"]}});
        }
        EXPECT_EQ(content.find("<tool"), std::string::npos) << "step " << step;
      }
    };
    for (size_t i = 0; i < kOutput.size(); i += step) take(stream.feed(std::string_view(kOutput).substr(i, step)));
    take(stream.finish());
    std::string finish = "stop";
    json whole = chat_message(kOutput, true, &finish, counting_ids());
    EXPECT_EQ(content, whole["content"]) << "step " << step;
    EXPECT_EQ(calls, whole["tool_calls"]) << "step " << step;
    EXPECT_TRUE(stream.made_tool_calls());
  }
}

TEST(ChatOutput, StreamWithoutToolsPassesPiecesThrough) {
  ChatDeltaStream stream(false);
  auto d = stream.feed("<tool_call>");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]["content"], "<tool_call>");
  EXPECT_TRUE(stream.finish().empty());
  EXPECT_FALSE(stream.made_tool_calls());
}

TEST(ChatOutput, ToolCallIdsAreFreshAndOpenAIShaped) {
  const std::string a = new_tool_call_id(), b = new_tool_call_id();
  EXPECT_EQ(a.rfind("call_", 0), 0u);
  EXPECT_EQ(a.size(), 29u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace ms
