// Tool calls in model output (chat/tool_calls.cpp): the input is what a model generated,
// which nothing has checked. It is split whole, and streamed in pieces whose sizes the first
// byte picks; tool_calls.h promises both give the same content and calls.
#include <algorithm>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "chat/tool_calls.h"
#include "util/error.h"

namespace {

ms::ToolCallOutput streamed(std::string_view text, size_t piece) {
  ms::ToolCallStream stream;
  ms::ToolCallOutput all;
  auto add = [&](ms::ToolCallOutput out) {
    all.content += out.content;
    for (auto& c : out.calls) all.calls.push_back(std::move(c));
  };
  for (size_t at = 0; at < text.size(); at += piece) add(stream.feed(text.substr(at, piece)));
  add(stream.finish());
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const ms::ToolCallOutput whole = ms::parse_tool_calls(text);
    const ms::ToolCallOutput pieces = streamed(text, piece);
    if (whole.content != pieces.content || whole.calls != pieces.calls)
      ms::fuzz::accepted_invalid("streamed tool calls differ from the whole output's");
  } catch (const ms::Error& e) {
    ms::fuzz::refused(e);
  }
  return 0;
}
