#pragma once
// Tool calls in model output, in the Hermes/Qwen form the chat template asks for:
//   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//
// Rules, the same for whole text and for text arriving in pieces:
// - Text outside tool-call blocks is content, byte for byte, except whitespace directly before
//   `<tool_call>` or directly after `</tool_call>` (the template's own separators), which is
//   dropped; so rendering an assistant turn with the template and parsing it back gives the
//   original content and calls.
// - A block whose body is not a JSON object with a string "name" (and, when present, an
//   "arguments" value) is malformed: the whole block, tags included, is passed through as
//   content with the whitespace before it, so nothing the model wrote is lost. So is a
//   `<tool_call>` never closed by the end of the output.
// - A streaming parser never emits a partial `<tool_call>` tag as content: text that could
//   still become one is held back until it is decided.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace ms {

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments;  // as the model wrote it; {} when absent
  bool operator==(const ToolCall&) const = default;
};

struct ToolCallOutput {
  std::string content;
  std::vector<ToolCall> calls;
};

// Splits complete model output into content and tool calls.
ToolCallOutput parse_tool_calls(std::string_view text);

class ToolCallStream {
 public:
  // Takes the next piece of model output; returns the content now safe to show and the calls
  // completed by this piece.
  ToolCallOutput feed(std::string_view piece);
  // End of output: releases held-back text (and an unclosed block, as content).
  ToolCallOutput finish();

 private:
  std::string pending_;       // received, not yet emitted or decided
  bool in_call_ = false;      // pending_ is (the start of) the body of an open <tool_call>
  bool after_call_ = false;   // pending_ follows a </tool_call>: its leading whitespace is dropped
  std::string space_before_;  // whitespace before the open <tool_call>, kept if the block is malformed
};

}  // namespace ms
