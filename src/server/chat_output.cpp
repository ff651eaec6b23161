#include "server/chat_output.h"

#include <random>

namespace ms {

using ojson = nlohmann::ordered_json;

namespace {

ojson openai_tool_call(const ToolCall& c, const std::string& id) {
  // OpenAI sends arguments as JSON text; the model may have written any JSON value there.
  return {{"id", id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments.dump()}}}};
}

}  // namespace

std::string new_tool_call_id() {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

ojson chat_message(std::string_view text, bool parse_tools, std::string* finish_reason,
                   const std::function<std::string()>& make_id) {
  ojson msg = {{"role", "assistant"}};
  if (!parse_tools) {
    msg["content"] = std::string(text);
    return msg;
  }
  ToolCallOutput out = parse_tool_calls(text);
  // OpenAI's form: content is null when the turn only calls tools.
  msg["content"] = out.content.empty() && !out.calls.empty() ? ojson() : ojson(out.content);
  if (!out.calls.empty()) {
    ojson calls = ojson::array();
    for (const ToolCall& c : out.calls) calls.push_back(openai_tool_call(c, make_id()));
    msg["tool_calls"] = std::move(calls);
    if (finish_reason && *finish_reason == "stop") *finish_reason = "tool_calls";
  }
  return msg;
}

std::vector<ojson> ChatDeltaStream::deltas(const ToolCallOutput& out) {
  std::vector<ojson> d;
  if (!out.content.empty()) d.push_back({{"content", out.content}});
  for (const ToolCall& c : out.calls) {
    ojson call = openai_tool_call(c, make_id_());
    call = {{"index", calls_++}, {"id", call["id"]}, {"type", "function"}, {"function", call["function"]}};
    d.push_back({{"tool_calls", ojson::array({std::move(call)})}});
  }
  return d;
}

std::vector<ojson> ChatDeltaStream::feed(std::string_view piece) {
  if (!parse_tools_) {
    if (piece.empty()) return {};
    return {ojson{{"content", std::string(piece)}}};
  }
  return deltas(stream_.feed(piece));
}

std::vector<ojson> ChatDeltaStream::finish() {
  if (!parse_tools_) return {};
  return deltas(stream_.finish());
}

}  // namespace ms
