#include <gtest/gtest.h>

#include "chat/tool_calls.h"

namespace ms {
namespace {

using json = nlohmann::ordered_json;

// Model output with content before, between-call newlines, a "<" that is no tag, and text after.
const std::string kSample =
    "I'll look both up (a < b, <tool> is not a tag).\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>\n"
    "Done.";

void expect_sample(const ToolCallOutput& out) {
  EXPECT_EQ(out.content, "I'll look both up (a < b, <tool> is not a tag).Done.");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments.dump(), R"({"city":"Paris","days":2})");  // key order kept
  EXPECT_EQ(out.calls[1].name, "get_time");
  EXPECT_EQ(out.calls[1].arguments, json({{"tz", "CET"}}));
}

// Feeds the pieces; checks that what was shown so far is always a prefix of the final content
// (so no partial tag or held text was ever emitted and taken back).
ToolCallOutput stream_pieces(const std::vector<std::string>& pieces, const std::string& final_content) {
  ToolCallStream stream;
  ToolCallOutput all;
  auto add = [&](ToolCallOutput out) {
    all.content += out.content;
    for (auto& c : out.calls) all.calls.push_back(std::move(c));
    EXPECT_EQ(final_content.compare(0, all.content.size(), all.content), 0) << "shown: " << all.content;
  };
  for (const auto& p : pieces) add(stream.feed(p));
  add(stream.finish());
  return all;
}

TEST(ToolCalls, WholeText) { expect_sample(parse_tool_calls(kSample)); }

TEST(ToolCalls, PlainTextPassesThroughUnchanged) {
  ToolCallOutput out = parse_tool_calls("just text, <tool_ and <tool_call but no call \n\n");
  EXPECT_EQ(out.content, "just text, <tool_ and <tool_call but no call \n\n");
  EXPECT_TRUE(out.calls.empty());
}

TEST(ToolCalls, OnlyCallsGiveEmptyContent) {
  ToolCallOutput out = parse_tool_calls("<tool_call>\n{\"name\": \"f\"}\n</tool_call>\n");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, json::object());  // absent arguments read as {}
}

TEST(ToolCalls, StringArgumentsAreKeptAsWritten) {
  ToolCallOutput out = parse_tool_calls(R"(<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>)");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, json("{\"a\": 1}"));
}

TEST(ToolCalls, MalformedBlockIsContentVerbatim) {
  std::string bad = "Trying.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>\nAfter.";
  ToolCallOutput out = parse_tool_calls(bad);
  EXPECT_EQ(out.content, bad);
  EXPECT_TRUE(out.calls.empty());

  std::string no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
  EXPECT_EQ(parse_tool_calls(no_name).content, no_name);
  std::string not_object = "<tool_call>[1, 2]</tool_call>";
  EXPECT_EQ(parse_tool_calls(not_object).content, not_object);
}

TEST(ToolCalls, DeeplyNestedBlockIsContentNotACrash) {
  // A model can print anything: a 300k-deep argument is text, as a malformed one is.
  const std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(300000, '[') +
                           std::string(300000, ']') + "}</tool_call>";
  ToolCallOutput out = parse_tool_calls(deep);
  EXPECT_EQ(out.content, deep);
  EXPECT_TRUE(out.calls.empty());
}

TEST(ToolCalls, MalformedBlockBetweenGoodOnes) {
  ToolCallOutput out = parse_tool_calls(
      "<tool_call>{\"name\": \"a\"}</tool_call>\n<tool_call>oops</tool_call>\n<tool_call>{\"name\": \"b\"}</tool_call>");
  EXPECT_EQ(out.content, "<tool_call>oops</tool_call>");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "a");
  EXPECT_EQ(out.calls[1].name, "b");
}

TEST(ToolCalls, UnclosedCallAtEndIsContent) {
  std::string text = "Sure.\n<tool_call>\n{\"name\": \"f\", \"argu";
  ToolCallOutput out = parse_tool_calls(text);
  EXPECT_EQ(out.content, text);
  EXPECT_TRUE(out.calls.empty());
}

TEST(ToolCalls, StreamingHoldsBackAPartialTag) {
  ToolCallStream stream;
  EXPECT_EQ(stream.feed("Hello <to").content, "Hello");
  EXPECT_EQ(stream.feed("ol_c").content, "");
  ToolCallOutput out = stream.feed("all>{\"name\": \"f\"}</tool_call>");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(stream.feed(" <tooth>").content, "<tooth>");
  EXPECT_EQ(stream.finish().content, "");
}

TEST(ToolCalls, EverySplitPointGivesTheSameResult) {
  std::string expected_content = parse_tool_calls(kSample).content;
  for (size_t i = 0; i <= kSample.size(); ++i) {
    SCOPED_TRACE("split at " + std::to_string(i));
    expect_sample(stream_pieces({kSample.substr(0, i), kSample.substr(i)}, expected_content));
  }
}

TEST(ToolCalls, EveryPairOfSplitPointsGivesTheSameResult) {
  std::string expected_content = parse_tool_calls(kSample).content;
  for (size_t i = 0; i <= kSample.size(); ++i)
    for (size_t j = i; j <= kSample.size(); ++j) {
      ToolCallOutput out =
          stream_pieces({kSample.substr(0, i), kSample.substr(i, j - i), kSample.substr(j)}, expected_content);
      ASSERT_EQ(out.content, expected_content) << "splits " << i << ", " << j;
      ASSERT_EQ(out.calls.size(), 2u) << "splits " << i << ", " << j;
    }
}

TEST(ToolCalls, OneByteAtATime) {
  std::vector<std::string> bytes;
  for (char c : kSample) bytes.emplace_back(1, c);
  expect_sample(stream_pieces(bytes, parse_tool_calls(kSample).content));
}

}  // namespace
}  // namespace ms
