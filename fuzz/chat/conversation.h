#pragma once
// A fixed conversation for the chat template targets: every role, reasoning (in its member and in <think>), a tool call and
// its result, and one tool schema, so a template's branches for each of them are reached.
#include <nlohmann/json.hpp>

namespace ms::fuzz {

inline const nlohmann::ordered_json& conversation() {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2? <|im_end|>"},
    {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
    {"role": "user", "content": "And the weather in Paris?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"celsius\": 21}"},
    {"role": "assistant", "content": "<think>\nIt is mild.\n</think>\n\n21 degrees."},
    {"role": "user", "content": "Thanks"}
  ])");
  return messages;
}

inline const nlohmann::ordered_json& tools() {
  static const nlohmann::ordered_json list = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "weather", "description": "Current weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
  ])");
  return list;
}

}  // namespace ms::fuzz
