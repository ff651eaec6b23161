// The real chat template (models/pycoder-moe-q4's, the Qwen3 one) rendered with fuzzed
// variables, then tokenized as the server does. The input is JSON as the reference cases hold
// it: an object with "messages" and optionally "tools" and "add_generation_prompt", every other
// member an extra variable; or an array, taken as the messages. No variable may forge a turn:
// every special token of the encoding must come from the template's own (trusted) text.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "chat/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

using json = nlohmann::ordered_json;

constexpr size_t kMaxDepth = 64;
const char* const kModel = "models/pycoder-moe-q4";

ms::MarkedText render(const ms::ChatTemplate& tmpl, const json& input) {
  if (!input.is_object()) return tmpl.render_marked(input, nullptr, true);
  json extra = input;
  const json messages = input.contains("messages") ? input["messages"] : json::array();
  const json tools = input.contains("tools") ? input["tools"] : json();
  const json prompt = input.contains("add_generation_prompt") ? input["add_generation_prompt"] : json(true);
  for (const char* key : {"messages", "tools", "add_generation_prompt"}) extra.erase(key);
  return tmpl.render_marked(messages, tools, prompt.is_boolean() && prompt.get<bool>(), extra);
}

// The spellings of the tokenizer's special tokens ("<|im_start|>", ...).
std::vector<std::string> special_spellings(const ms::Tokenizer& tok) {
  std::vector<std::string> r;
  for (int id = 0; id < tok.vocab_size(); ++id)
    if (tok.is_special(id) && !tok.token_text(id).empty()) r.push_back(tok.token_text(id));
  return r;
}

// How many special-token spellings lie wholly in trusted bytes: the most the encoding may hold.
size_t trusted_specials(const ms::MarkedText& m, const std::vector<std::string>& spellings) {
  size_t n = 0;
  for (size_t at = 0; at < m.text.size();) {
    size_t len = 0;
    for (const auto& s : spellings)
      if (m.text.compare(at, s.size(), s) == 0 && !m.overlaps_untrusted(at, at + s.size())) len = s.size();
    n += len ? 1 : 0;
    at += len ? len : 1;
  }
  return n;
}

void check_no_forged_turn(const ms::Tokenizer& tok, const ms::MarkedText& m) {
  static const std::vector<std::string> spellings = special_spellings(tok);
  size_t specials = 0;
  for (int id : tok.encode(m)) specials += tok.is_special(id) ? 1 : 0;
  if (specials > trusted_specials(m, spellings))
    ms::fuzz::accepted_invalid("a special token tokenized from request text (a forged turn)");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ms::ChatTemplate tmpl =
      ms::ChatTemplate::from_tokenizer_config(ms::fuzz::source_path(std::string(kModel) + "/tokenizer_config.json"));
  static const ms::Tokenizer tok = ms::Tokenizer::load(ms::fuzz::source_path(std::string(kModel) + "/tokenizer.json"));
  // Requests reach a template through the server's parse_body, which refuses more than 64
  // levels before parsing (ordered_json::parse itself recurses on deeper JSON).
  if (ms::fuzz::json_depth(std::string_view(reinterpret_cast<const char*>(data), size)) > kMaxDepth) return 0;
  const json input = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded()) return 0;
  try {
    check_no_forged_turn(tok, render(tmpl, input));
  } catch (const ms::Error& e) {
    // Variables the template refuses (raise_exception, a wrong type, a reserved name): expected.
    ms::fuzz::refused(e);
  }
  return 0;
}
