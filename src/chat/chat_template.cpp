#include "chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"
#include "util/json.h"

namespace ms {
namespace {

// The special tokens transformers passes from tokenizer_config.json.
constexpr const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                             "pad_token", "cls_token", "mask_token"};


std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token is a string or an AddedToken object {"content": ...}; the template sees its text.
nlohmann::ordered_json token_text(const nlohmann::ordered_json& token, const std::string& path, const std::string& key) {
  if (token.is_string()) return token;
  if (token.is_object() && token.contains("content") && token["content"].is_string()) return token["content"];
  fail("{}: '{}' is neither a string nor an object with a string 'content'", path, key);
}

// transformers passes the tokenizer's special_tokens_map: the tokens that are set, as text.
nlohmann::ordered_json special_tokens_of(const nlohmann::ordered_json& config, const std::string& path) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  for (const char* key : kSpecialTokenKeys)
    if (config.contains(key) && !config[key].is_null()) tokens[key] = token_text(config[key], path, key);
  if (config.contains("additional_special_tokens") && !config["additional_special_tokens"].is_null()) {
    const auto& field = config["additional_special_tokens"];
    if (!field.is_array())
      fail("{}: 'additional_special_tokens' must be a list, got {}", path, field.type_name());
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (size_t i = 0; i < field.size(); ++i)
      list.push_back(token_text(field[i], path, fmt::format("additional_special_tokens[{}]", i)));
    tokens["additional_special_tokens"] = std::move(list);
  }
  return tokens;
}

jinja::Template compile(const std::string& source, const std::string& where) {
  try {
    return jinja::Template(source);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source, nlohmann::ordered_json special_tokens)
    : special_tokens_(std::move(special_tokens)) {
  templates_.emplace_back("default", jinja::Template(source));
}

ChatTemplate::ChatTemplate(std::vector<std::pair<std::string, jinja::Template>> templates,
                           nlohmann::ordered_json special_tokens)
    : templates_(std::move(templates)), special_tokens_(std::move(special_tokens)) {}

ChatTemplate ChatTemplate::from_tokenizer_config(const std::string& path) {
  const nlohmann::ordered_json config = parse_json<nlohmann::ordered_json>(read_file(path), path);
  if (!config.is_object()) fail("{}: expected a JSON object", path);
  std::vector<std::pair<std::string, jinja::Template>> templates;
  const auto& field = config.contains("chat_template") ? config["chat_template"] : nlohmann::ordered_json();
  if (field.is_string()) {
    templates.emplace_back("default", compile(field.get<std::string>(), path));
  } else if (field.is_array()) {
    for (const auto& entry : field) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
          !entry["template"].is_string())
        fail("{}: each chat_template entry needs string 'name' and 'template'", path);
      std::string name = entry["name"].get<std::string>();
      templates.emplace_back(name, compile(entry["template"].get<std::string>(), path + " (template '" + name + "')"));
    }
  } else if (field.is_null()) {
    auto sibling = std::filesystem::path(path).parent_path() / "chat_template.jinja";
    if (!std::filesystem::exists(sibling)) fail("{}: no 'chat_template' and no {}", path, sibling.string());
    templates.emplace_back("default", compile(read_file(sibling), sibling.string()));
  } else {
    fail("{}: 'chat_template' must be a string or a list of named templates, got {}", path, field.type_name());
  }
  return ChatTemplate(std::move(templates), special_tokens_of(config, path));
}

const jinja::Template& ChatTemplate::pick(bool has_tools) const {
  auto find = [&](std::string_view name) -> const jinja::Template* {
    for (const auto& [n, t] : templates_)
      if (n == name) return &t;
    return nullptr;
  };
  if (templates_.size() == 1) return templates_[0].second;
  if (has_tools)
    if (const auto* t = find("tool_use")) return *t;
  if (const auto* t = find("default")) return *t;
  fail("chat template: several named templates and none is called 'default'");
}

bool ChatTemplate::reserved_variable(std::string_view name) {
  static constexpr std::string_view kSet[] = {
      // what render() passes, as transformers' apply_chat_template does
      "messages", "tools", "documents", "add_generation_prompt", "additional_special_tokens",
      // the interpreter's globals (jinja.h), which a variable of the same name would hide
      "range", "namespace", "dict", "raise_exception", "strftime_now"};
  for (std::string_view reserved : kSet)
    if (name == reserved) return true;
  for (std::string_view reserved : kSpecialTokenKeys)
    if (name == reserved) return true;
  return false;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra) const {
  return render_marked(messages, tools, add_generation_prompt, extra).text;
}

MarkedText ChatTemplate::render_marked(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                       bool add_generation_prompt, const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) fail("chat template: messages must be an array, got {}", messages.type_name());
  if (!tools.is_null() && !tools.is_array()) fail("chat template: tools must be null or an array, got {}", tools.type_name());
  if (!extra.is_object() && !extra.is_null()) fail("chat template: extra variables must be an object, got {}", extra.type_name());
  // The variables transformers' apply_chat_template passes. What the caller gives (messages,
  // tools, extra) is untrusted text; the rest comes from the model's own files.
  nlohmann::ordered_json trusted = {{"documents", nullptr}, {"add_generation_prompt", add_generation_prompt}};
  for (const auto& [k, v] : special_tokens_.items()) trusted[k] = v;
  nlohmann::ordered_json untrusted = {{"messages", messages}, {"tools", tools}};
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) {
      if (reserved_variable(k)) fail("chat template: the variable '{}' is set by the template layer and cannot be replaced", k);
      untrusted[k] = v;
    }
  return pick(!tools.is_null()).render(trusted, untrusted);
}

}  // namespace ms
