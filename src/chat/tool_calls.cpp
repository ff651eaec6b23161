#include "chat/tool_calls.h"

#include <optional>

#include "util/json.h"

namespace ms {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// End of s[0, end) without its trailing whitespace.
size_t trim_end(std::string_view s, size_t end) {
  while (end > 0 && is_space(s[end - 1])) --end;
  return end;
}

// Where a suffix of s that is a proper prefix of `<tool_call>` begins (s.size() if none): that
// text may yet become a tag, so it is held back.
size_t partial_tag_start(std::string_view s) {
  for (size_t len = std::min(s.size(), kOpen.size() - 1); len > 0; --len)
    if (s.substr(s.size() - len) == kOpen.substr(0, len)) return s.size() - len;
  return s.size();
}

std::optional<ToolCall> parse_call(std::string_view body) {
  nlohmann::ordered_json j;
  try {
    j = parse_json<nlohmann::ordered_json>(body, "tool call");
  } catch (const Error&) {  // not JSON (or nested past the bound): the text stays text
    return std::nullopt;
  }
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ToolCall call{j["name"].get<std::string>(), nlohmann::ordered_json::object()};
  if (j.contains("arguments")) call.arguments = j["arguments"];
  return call;
}

}  // namespace

ToolCallOutput ToolCallStream::feed(std::string_view piece) {
  pending_ += piece;
  ToolCallOutput out;
  for (;;) {
    if (in_call_) {
      size_t close = pending_.find(kClose);
      if (close == std::string::npos) return out;
      std::string body = pending_.substr(0, close);
      pending_.erase(0, close + kClose.size());
      in_call_ = false;
      if (auto call = parse_call(body)) {
        out.calls.push_back(std::move(*call));
        after_call_ = true;
      } else {
        out.content += space_before_ + std::string(kOpen) + body + std::string(kClose);
      }
      space_before_.clear();
      continue;
    }
    if (after_call_) {
      size_t text = 0;
      while (text < pending_.size() && is_space(pending_[text])) ++text;
      pending_.erase(0, text);
      if (pending_.empty()) return out;
      after_call_ = false;
    }
    size_t open = pending_.find(kOpen);
    if (open != std::string::npos) {
      size_t text_end = trim_end(pending_, open);
      out.content += pending_.substr(0, text_end);
      space_before_ = pending_.substr(text_end, open - text_end);
      pending_.erase(0, open + kOpen.size());
      in_call_ = true;
      continue;
    }
    // Hold back a possible start of a tag and the whitespace before it; the rest is content.
    size_t emit = trim_end(pending_, partial_tag_start(pending_));
    out.content += pending_.substr(0, emit);
    pending_.erase(0, emit);
    return out;
  }
}

ToolCallOutput ToolCallStream::finish() {
  ToolCallOutput out;
  if (in_call_)
    out.content = space_before_ + std::string(kOpen) + pending_;
  else if (!after_call_)
    out.content = pending_;
  *this = ToolCallStream();
  return out;
}

ToolCallOutput parse_tool_calls(std::string_view text) {
  ToolCallStream stream;
  ToolCallOutput out = stream.feed(text);
  ToolCallOutput rest = stream.finish();
  out.content += rest.content;
  for (auto& call : rest.calls) out.calls.push_back(std::move(call));
  return out;
}

}  // namespace ms
