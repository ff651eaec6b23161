#pragma once
// Model output → OpenAI chat message parts: content, and `<tool_call>` blocks as `tool_calls`
// ({"id", "type": "function", "function": {"name", "arguments": JSON text}}), whole or streamed.
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>

#include "chat/tool_calls.h"

namespace ms {

// A fresh tool call id ("call_" and 24 random letters and digits).
std::string new_tool_call_id();

// The assistant message of a non-streamed answer. With parse_tools false the text is all content.
// finish_reason becomes "tool_calls" when calls were made and the model stopped by itself.
nlohmann::ordered_json chat_message(std::string_view text, bool parse_tools, std::string* finish_reason,
                                    const std::function<std::string()>& make_id = new_tool_call_id);

// The deltas of a streamed answer: feed() each piece of text, then finish(). Each returns the
// `delta` objects to send, in order (possibly none): {"content": ...} or
// {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}.
class ChatDeltaStream {
 public:
  explicit ChatDeltaStream(bool parse_tools, std::function<std::string()> make_id = new_tool_call_id)
      : parse_tools_(parse_tools), make_id_(std::move(make_id)) {}

  std::vector<nlohmann::ordered_json> feed(std::string_view piece);
  std::vector<nlohmann::ordered_json> finish();
  bool made_tool_calls() const { return calls_ > 0; }

 private:
  std::vector<nlohmann::ordered_json> deltas(const ToolCallOutput& out);

  bool parse_tools_;
  std::function<std::string()> make_id_;
  ToolCallStream stream_;
  int calls_ = 0;
};

}  // namespace ms
