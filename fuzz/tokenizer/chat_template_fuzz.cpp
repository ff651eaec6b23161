// The real chat template (models/pycoder-moe-q4's, the Qwen3 one) rendered with fuzzed
// variables. The input is JSON as the reference cases hold it: an object with "messages" and
// optionally "tools" and "add_generation_prompt", every other member an extra variable; or an
// array, taken as the messages.
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "tokenizer/chat_template.h"
#include "util/error.h"

namespace {

using json = nlohmann::ordered_json;

constexpr size_t kMaxDepth = 64;

void render(const ms::ChatTemplate& tmpl, const json& input) {
  if (!input.is_object()) {
    (void)tmpl.render(input, nullptr, true);
    return;
  }
  json extra = input;
  const json messages = input.contains("messages") ? input["messages"] : json::array();
  const json tools = input.contains("tools") ? input["tools"] : json();
  const json prompt = input.contains("add_generation_prompt") ? input["add_generation_prompt"] : json(true);
  for (const char* key : {"messages", "tools", "add_generation_prompt"}) extra.erase(key);
  (void)tmpl.render(messages, tools, prompt.is_boolean() && prompt.get<bool>(), extra);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ms::ChatTemplate tmpl =
      ms::ChatTemplate::from_tokenizer_config(ms::fuzz::source_path("models/pycoder-moe-q4/tokenizer_config.json"));
  // Requests reach a template through the server's parse_body, which refuses more than 64
  // levels before parsing (ordered_json::parse itself recurses on deeper JSON).
  if (ms::fuzz::json_depth(std::string_view(reinterpret_cast<const char*>(data), size)) > kMaxDepth) return 0;
  const json input = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded()) return 0;
  try {
    render(tmpl, input);
  } catch (const ms::Error& e) {
    // Variables the template refuses (raise_exception, a wrong type): the expected outcome.
    ms::fuzz::refused(e);
  }
  return 0;
}
