#pragma once
// The model's chat template (tokenizer_config.json's `chat_template`), rendered as
// transformers' apply_chat_template renders it.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja.h"
#include "tokenizer/marked_text.h"

namespace ms {

class ChatTemplate {
 public:
  // Reads `chat_template` (a string, or a list of {"name", "template"}) and the special tokens
  // (bos_token, eos_token, ...) from tokenizer_config.json; without `chat_template`, falls back
  // to a chat_template.jinja beside it, as transformers does.
  static ChatTemplate from_tokenizer_config(const std::string& path);

  // One unnamed template; `special_tokens` maps e.g. "eos_token" to its text.
  explicit ChatTemplate(std::string_view source, nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());

  // messages: the conversation (array of {"role", "content", ...}); tools: null or an array of
  // tool schemas; extra: more template variables, e.g. {"enable_thinking": false}, which may not
  // replace one the template layer sets (reserved_variable).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // The same text, with every byte that came from messages, tools or extra marked untrusted
  // (what Tokenizer::encode(const MarkedText&) reads as plain text).
  MarkedText render_marked(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                           bool add_generation_prompt,
                           const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // True for the names the template layer itself sets (messages, tools, add_generation_prompt,
  // the special tokens, the globals raise_exception, strftime_now, ...): extra variables may
  // not replace them.
  static bool reserved_variable(std::string_view name);

  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate(std::vector<std::pair<std::string, jinja::Template>> templates, nlohmann::ordered_json special_tokens);
  const jinja::Template& pick(bool has_tools) const;

  std::vector<std::pair<std::string, jinja::Template>> templates_;  // name → template
  nlohmann::ordered_json special_tokens_;
};

}  // namespace ms
