#include "server/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "server/api_error.h"
#include "chat/chat_template.h"
#include "chat/json_schema.h"
#include "util/json.h"
#include "tokenizer/utf8.h"

namespace ms {

using ojson = nlohmann::ordered_json;

namespace {

std::string member_path(const std::string& parent, std::string_view name) {
  return parent.empty() ? std::string(name) : fmt::format("{}.{}", parent, name);
}

void reject_unknown(const ojson& obj, const std::string& where, std::initializer_list<std::string_view> known) {
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      invalid_param(member_path(where, it.key()), fmt::format("unknown member '{}'{}", it.key(), where.empty() ? "" : " in " + where),
                    "unknown_parameter");
}

// The member, or null when absent or null (OpenAI reads null as "not given").
const ojson* member(const ojson& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const ojson& v) {
  invalid_param(param, fmt::format("{} must be {}, is {}", param, expected, v.type_name()), "invalid_type");
}

const ojson& object(const ojson& v, const std::string& param) {
  if (!v.is_object()) wrong_type(param, "an object", v);
  return v;
}

const ojson& array(const ojson& v, const std::string& param) {
  if (!v.is_array()) wrong_type(param, "an array", v);
  return v;
}

std::string string(const ojson& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.get<std::string>();
}

bool boolean(const ojson& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, "a boolean", v);
  return v.get<bool>();
}

double number(const ojson& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) wrong_type(param, "a number", v);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) invalid_param(param, fmt::format("{} must be in [{}, {}], is {}", param, lo, hi, x));
  return x;
}

int64_t integer(const ojson& v, const std::string& param, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) wrong_type(param, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    invalid_param(param, fmt::format("{} must be at most {}", param, hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) invalid_param(param, fmt::format("{} must be in [{}, {}], is {}", param, lo, hi, x));
  return x;
}

std::vector<std::string> stop_strings(const ojson& v) {
  std::vector<std::string> out;
  if (v.is_string()) out.push_back(v.get<std::string>());
  else if (v.is_array()) {
    if (v.size() > 16) invalid_param("stop", "stop holds at most 16 strings");
    for (size_t i = 0; i < v.size(); ++i) out.push_back(string(v[i], fmt::format("stop[{}]", i)));
  } else
    wrong_type("stop", "a string or an array of strings", v);
  for (const auto& s : out)
    if (s.empty()) invalid_param("stop", "stop strings must not be empty");
  return out;
}

// The `speculative` extension: "off", "mtp", "auto", or {"mode": one of those, "draft": 1..kMaxDraft | "auto"}.
SpeculativeOptions speculative(const ojson& v) {
  SpeculativeOptions o;
  auto mode = [&o](const ojson& m, const std::string& param) {
    const std::string s = string(m, param);
    if (s != "off" && s != "mtp" && s != "auto")
      invalid_param(param, fmt::format("{} must be \"off\", \"mtp\" or \"auto\", is \"{}\"", param, s));
    o.mtp = s == "mtp";
    o.automatic = s == "auto";
  };
  if (v.is_string()) {
    mode(v, "speculative");
    return o;
  }
  if (!v.is_object()) wrong_type("speculative", "\"off\", \"mtp\", \"auto\" or an object", v);
  reject_unknown(v, "speculative", {"mode", "draft"});
  const ojson* m = member(v, "mode");
  if (!m) invalid_param("speculative.mode", "speculative.mode is required (\"off\", \"mtp\" or \"auto\")");
  mode(*m, "speculative.mode");
  if (const ojson* d = member(v, "draft")) {
    if (d->is_string() && d->get<std::string>() == "auto") o.draft = kDraftAuto;
    else if (d->is_number_integer()) o.draft = int(integer(*d, "speculative.draft", 1, kMaxDraft));
    else wrong_type("speculative.draft", "an integer 1 to 4 or \"auto\"", *d);
    static_assert(kMaxDraft == 4, "the message above names the most drafts");
  }
  return o;
}

// temperature (0 to temperature_max), top_p and top_k, as the chat-like APIs spell them.
void read_sampling(const ojson& body, double temperature_max, SamplingParams& s) {
  if (const ojson* v = member(body, "temperature")) s.temperature = float(number(*v, "temperature", 0, temperature_max));
  if (const ojson* v = member(body, "top_p")) {
    s.top_p = float(number(*v, "top_p", 0, 1));
    if (s.top_p == 0.f) invalid_param("top_p", "top_p must be in (0, 1], is 0");
  }
  if (const ojson* v = member(body, "top_k")) s.top_k = int(integer(*v, "top_k", 0, 1 << 30));
}

// The members chat and text completions share; `max_tokens_default` applies when absent.
CompletionOptions read_options(const ojson& body) {
  CompletionOptions o;
  if (const ojson* v = member(body, "model")) string(*v, "model");  // one model is served: any name selects it
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (const ojson* v = member(body, name)) o.max_tokens = int(integer(*v, name, 1, 1 << 30));
  SamplingParams& s = o.sampling;
  read_sampling(body, 2, s);
  if (const ojson* v = member(body, "min_p")) s.min_p = float(number(*v, "min_p", 0, 1));
  if (const ojson* v = member(body, "repetition_penalty")) {
    s.repetition_penalty = float(number(*v, "repetition_penalty", 0, 100));
    if (s.repetition_penalty == 0.f) invalid_param("repetition_penalty", "repetition_penalty must be > 0");
  }
  if (const ojson* v = member(body, "presence_penalty")) s.presence_penalty = float(number(*v, "presence_penalty", -2, 2));
  if (const ojson* v = member(body, "frequency_penalty")) s.frequency_penalty = float(number(*v, "frequency_penalty", -2, 2));
  if (const ojson* v = member(body, "seed")) s.seed = uint64_t(integer(*v, "seed", INT64_MIN, INT64_MAX));
  if (const ojson* v = member(body, "stop")) o.stop = stop_strings(*v);
  if (const ojson* v = member(body, "stream")) o.stream = boolean(*v, "stream");
  if (const ojson* v = member(body, "stream_options")) {
    if (!o.stream) invalid_param("stream_options", "stream_options is only allowed when stream is true");
    reject_unknown(object(*v, "stream_options"), "stream_options", {"include_usage"});
    if (const ojson* u = member(*v, "include_usage")) o.include_usage = boolean(*u, "stream_options.include_usage");
  }
  if (const ojson* v = member(body, "ignore_eos")) o.ignore_eos = boolean(*v, "ignore_eos");
  if (const ojson* v = member(body, "speculative")) o.speculative = speculative(*v);
  if (const ojson* v = member(body, "n"); v && integer(*v, "n", 1, 1 << 30) != 1)
    invalid_param("n", "n must be 1: this server makes one choice per request", "unsupported_value");
  if (const ojson* v = member(body, "logit_bias"); v && !object(*v, "logit_bias").empty())
    invalid_param("logit_bias", "logit_bias is not supported", "unsupported_value");
  if (const ojson* v = member(body, "user")) string(*v, "user");
  return o;
}

// OpenAI content: a string, or an array of parts of which only text parts are supported.
std::string message_content(const ojson& v, const std::string& param) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(param, "a string or an array of content parts", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", param, i);
    const ojson& part = object(v[i], p);
    reject_unknown(part, p, {"type", "text"});
    const ojson* type = member(part, "type");
    if (!type) invalid_param(p + ".type", p + ".type is required", "missing_required_parameter");
    if (string(*type, p + ".type") != "text")
      invalid_param(p + ".type", fmt::format("content part type '{}' is not supported (text only)", type->get<std::string>()),
                    "unsupported_value");
    const ojson* t = member(part, "text");
    if (!t) invalid_param(p + ".text", p + ".text is required", "missing_required_parameter");
    if (!text.empty()) text += "\n";
    text += string(*t, p + ".text");
  }
  return text;
}

ojson tool_call(const ojson& v, const std::string& p) {
  reject_unknown(object(v, p), p, {"id", "type", "function", "index"});
  if (const ojson* t = member(v, "type"); t && string(*t, p + ".type") != "function")
    invalid_param(p + ".type", p + ".type must be \"function\"");
  if (const ojson* id = member(v, "id")) string(*id, p + ".id");
  const ojson* f = member(v, "function");
  if (!f) invalid_param(p + ".function", p + ".function is required", "missing_required_parameter");
  const std::string fp = p + ".function";
  reject_unknown(object(*f, fp), fp, {"name", "arguments"});
  const ojson* name = member(*f, "name");
  if (!name) invalid_param(fp + ".name", fp + ".name is required", "missing_required_parameter");
  ojson fn = {{"name", string(*name, fp + ".name")}};
  const ojson* args = member(*f, "arguments");
  if (args && !args->is_string() && !args->is_object()) wrong_type(fp + ".arguments", "a string or an object", *args);
  fn["arguments"] = args ? *args : ojson("{}");
  return {{"type", "function"}, {"function", std::move(fn)}};
}

ojson message(const ojson& v, size_t index) {
  const std::string p = fmt::format("messages[{}]", index);
  reject_unknown(object(v, p), p, {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "refusal"});
  const ojson* role_v = member(v, "role");
  if (!role_v) invalid_param(p + ".role", p + ".role is required", "missing_required_parameter");
  std::string role = string(*role_v, p + ".role");
  if (role == "developer") role = "system";  // OpenAI's newer name for the system prompt
  if (role != "system" && role != "user" && role != "assistant" && role != "tool")
    invalid_param(p + ".role", fmt::format("{}.role must be system, developer, user, assistant or tool, is '{}'", p, role));
  ojson out = {{"role", role}};
  const ojson* content = member(v, "content");
  // An assistant turn that only calls tools has null content.
  if (!content && role != "assistant") invalid_param(p + ".content", p + ".content is required", "missing_required_parameter");
  out["content"] = content ? message_content(*content, p + ".content") : "";
  if (const ojson* n = member(v, "name")) out["name"] = string(*n, p + ".name");
  if (const ojson* r = member(v, "reasoning_content")) {
    if (role != "assistant") invalid_param(p + ".reasoning_content", "reasoning_content is only allowed in assistant messages");
    out["reasoning_content"] = string(*r, p + ".reasoning_content");
  }
  if (const ojson* r = member(v, "refusal")) string(*r, p + ".refusal");
  if (const ojson* calls = member(v, "tool_calls")) {
    if (role != "assistant") invalid_param(p + ".tool_calls", "tool_calls are only allowed in assistant messages");
    ojson list = ojson::array();
    for (size_t i = 0; i < array(*calls, p + ".tool_calls").size(); ++i)
      list.push_back(tool_call((*calls)[i], fmt::format("{}.tool_calls[{}]", p, i)));
    if (!list.empty()) out["tool_calls"] = std::move(list);
  }
  if (const ojson* id = member(v, "tool_call_id")) {
    if (role != "tool") invalid_param(p + ".tool_call_id", "tool_call_id is only allowed in tool messages");
    out["tool_call_id"] = string(*id, p + ".tool_call_id");
  }
  return out;
}

ojson tool_schema(const ojson& v, size_t index) {
  const std::string p = fmt::format("tools[{}]", index);
  reject_unknown(object(v, p), p, {"type", "function"});
  const ojson* type = member(v, "type");
  if (!type || string(*type, p + ".type") != "function") invalid_param(p + ".type", p + ".type must be \"function\"");
  const ojson* f = member(v, "function");
  if (!f) invalid_param(p + ".function", p + ".function is required", "missing_required_parameter");
  const std::string fp = p + ".function";
  reject_unknown(object(*f, fp), fp, {"name", "description", "parameters", "strict"});
  const ojson* name = member(*f, "name");
  if (!name || string(*name, fp + ".name").empty()) invalid_param(fp + ".name", fp + ".name is required", "missing_required_parameter");
  if (const ojson* d = member(*f, "description")) string(*d, fp + ".description");
  if (const ojson* s = member(*f, "parameters")) object(*s, fp + ".parameters");
  if (const ojson* s = member(*f, "strict")) boolean(*s, fp + ".strict");
  return v;
}

// chat_template_kwargs: more variables for the template, none replacing one the server or the
// template layer sets (messages, tools, add_generation_prompt, the special tokens, the globals).
ojson template_kwargs(const ojson& v) {
  for (const auto& [key, value] : object(v, "chat_template_kwargs").items())
    if (ChatTemplate::reserved_variable(key))
      invalid_param(member_path("chat_template_kwargs", key),
                    fmt::format("chat_template_kwargs.{} is set by the server and cannot be replaced", key),
                    "reserved_parameter");
  return v;
}

// A json_schema format's schema ({"schema": ..., "name", "strict", "description"} at `param`),
// compiled; what it cannot take is a 400 naming the keyword.
std::shared_ptr<const JsonSchema> compiled_schema(const ojson& format, const std::string& param) {
  const ojson* s = member(format, "schema");
  if (!s) invalid_param(param + ".schema", param + ".schema is required", "missing_required_parameter");
  if (const ojson* n = member(format, "name")) string(*n, param + ".name");
  if (const ojson* n = member(format, "strict")) boolean(*n, param + ".strict");
  if (const ojson* n = member(format, "description")) string(*n, param + ".description");
  try {
    return JsonSchema::compile(*s);
  } catch (const SchemaError& e) {
    invalid_param(param + ".schema" + (e.path.empty() ? "" : "." + e.path), e.what(), "unsupported_value");
  }
}

// tool_choice's forced call into o: every tool (`name` empty: "required", "any") or the one
// named, which must be among the tools (`param` names the member of the name); a strict tool's
// parameters compiled, so that its arguments validate.
// Tool i's parameters compiled where it is strict, else null; a keyword outside the subset is a
// 400 naming it.
std::shared_ptr<const JsonSchema> strict_parameters(const ojson& tools, size_t i) {
  const ojson& f = tools[i]["function"];
  if (!(f.contains("strict") && f["strict"] == true && f.contains("parameters"))) return nullptr;
  try {
    return JsonSchema::compile(f["parameters"]);
  } catch (const SchemaError& e) {
    invalid_param(fmt::format("tools[{}].function.parameters", i) + (e.path.empty() ? "" : "." + e.path), e.what(),
                  "unsupported_value");
  }
}

void force_tools(const ojson& tools, const std::string& name, const std::string& param, CompletionOptions& o) {
  if (tools.is_null()) invalid_param(param, "forcing a tool call needs tools");
  bool found = name.empty();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string n = tools[i]["function"]["name"].get<std::string>();
    found |= n == name;
    if (!name.empty() && n != name) continue;
    o.forced_tools.push_back(n);
    o.forced_tool_schemas.push_back(strict_parameters(tools, i));
  }
  if (!found) invalid_param(param, fmt::format("{} '{}' is not among the tools", param, name.substr(0, 128)));
}

// tool_choice "auto" (nothing forced) where some tool is strict: the calls the answer makes are
// held to the tools' names and the strict ones' parameters.
void hold_auto_tools(const ojson& tools, CompletionOptions& o) {
  if (tools.is_null() || !o.forced_tools.empty()) return;
  std::vector<std::string> names;
  std::vector<std::shared_ptr<const JsonSchema>> schemas;
  bool strict = false;
  for (size_t i = 0; i < tools.size(); ++i) {
    names.push_back(tools[i]["function"]["name"].get<std::string>());
    schemas.push_back(strict_parameters(tools, i));
    strict |= schemas.back() != nullptr;
  }
  if (!strict) return;
  o.auto_tools = std::move(names);
  o.auto_tool_schemas = std::move(schemas);
}

// tool_choice as a string, as the chat and Responses APIs share it: "auto", "none" or "required".
void string_tool_choice(const std::string& choice, ChatRequest& r) {
  if (choice == "none") r.tools = nullptr;
  else if (choice == "required") force_tools(r.tools, "", "tool_choice", r.options);
  else if (choice != "auto")
    invalid_param("tool_choice", fmt::format("tool_choice must be \"auto\", \"none\", \"required\" or a function, is '{}'",
                                             choice));
}

// The request's `tools`, each read by `one` (null when there are none).
ojson read_tools(const ojson& body, ojson (*one)(const ojson&, size_t)) {
  const ojson* t = member(body, "tools");
  if (!t) return nullptr;
  ojson tools = ojson::array();
  for (size_t i = 0; i < array(*t, "tools").size(); ++i) tools.push_back(one((*t)[i], i));
  return tools.empty() ? ojson(nullptr) : tools;
}

// --- The Anthropic Messages API (POST /v1/messages), read into the chat request above.

// A text block's text ({"type": "text", "text", "cache_control"?}); `what` names the others.
std::string text_block(const ojson& b, const std::string& p) {
  reject_unknown(b, p, {"type", "text", "cache_control", "citations"});
  const ojson* t = member(b, "text");
  if (!t) invalid_param(p + ".text", p + ".text is required", "missing_required_parameter");
  return string(*t, p + ".text");
}

std::string block_type(const ojson& b, const std::string& p) {
  const ojson* type = member(object(b, p), "type");
  if (!type) invalid_param(p + ".type", p + ".type is required", "missing_required_parameter");
  return string(*type, p + ".type");
}

[[noreturn]] void unsupported_block(const std::string& p, const std::string& type) {
  invalid_param(p + ".type", fmt::format("content block type '{}' is not supported here", type), "unsupported_value");
}

// Text as a string or an array of text blocks (system prompts, tool results).
std::string text_of(const ojson& v, const std::string& p) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(p, "a string or an array of text blocks", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string bp = fmt::format("{}[{}]", p, i);
    const std::string type = block_type(v[i], bp);
    if (type != "text") unsupported_block(bp, type);
    if (!text.empty()) text += "\n";
    text += text_block(v[i], bp);
  }
  return text;
}

// One Messages API message as chat messages: a user turn's tool_result blocks become tool messages
// (before its text), an assistant turn's tool_use blocks its tool_calls.
void append_anthropic_message(const ojson& v, size_t index, ojson& out) {
  const std::string p = fmt::format("messages[{}]", index);
  reject_unknown(object(v, p), p, {"role", "content"});
  const ojson* role_v = member(v, "role");
  if (!role_v) invalid_param(p + ".role", p + ".role is required", "missing_required_parameter");
  const std::string role = string(*role_v, p + ".role");
  if (role != "user" && role != "assistant")
    invalid_param(p + ".role", fmt::format("{}.role must be user or assistant, is '{}'", p, role));
  const ojson* content = member(v, "content");
  if (!content) invalid_param(p + ".content", p + ".content is required", "missing_required_parameter");
  if (content->is_string()) {
    out.push_back({{"role", role}, {"content", content->get<std::string>()}});
    return;
  }
  const std::string cp = p + ".content";
  std::string text, reasoning;
  ojson calls = ojson::array();
  for (size_t i = 0; i < array(*content, cp).size(); ++i) {
    const ojson& b = (*content)[i];
    const std::string bp = fmt::format("{}[{}]", cp, i);
    const std::string type = block_type(b, bp);
    if (type == "text") {
      if (!text.empty()) text += "\n";
      text += text_block(b, bp);
    } else if (type == "tool_result" && role == "user") {
      reject_unknown(b, bp, {"type", "tool_use_id", "content", "is_error", "cache_control"});
      const ojson* id = member(b, "tool_use_id");
      if (!id) invalid_param(bp + ".tool_use_id", bp + ".tool_use_id is required", "missing_required_parameter");
      if (const ojson* e = member(b, "is_error")) boolean(*e, bp + ".is_error");
      const ojson* c = member(b, "content");
      out.push_back({{"role", "tool"}, {"tool_call_id", string(*id, bp + ".tool_use_id")},
                     {"content", c ? text_of(*c, bp + ".content") : ""}});
    } else if (type == "tool_use" && role == "assistant") {
      reject_unknown(b, bp, {"type", "id", "name", "input", "cache_control"});
      const ojson* id = member(b, "id");
      const ojson* name = member(b, "name");
      if (!id) invalid_param(bp + ".id", bp + ".id is required", "missing_required_parameter");
      if (!name) invalid_param(bp + ".name", bp + ".name is required", "missing_required_parameter");
      const ojson* input = member(b, "input");
      calls.push_back({{"id", string(*id, bp + ".id")},
                       {"type", "function"},
                       {"function", {{"name", string(*name, bp + ".name")},
                                     {"arguments", input ? object(*input, bp + ".input") : ojson::object()}}}});
    } else if (type == "thinking" && role == "assistant") {
      reject_unknown(b, bp, {"type", "thinking", "signature"});
      const ojson* t = member(b, "thinking");
      if (t) reasoning += string(*t, bp + ".thinking");
    } else {
      unsupported_block(bp, type);
    }
  }
  if (role == "user" && text.empty() && calls.empty()) return;  // tool results alone
  ojson m = {{"role", role}, {"content", text}};
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  out.push_back(std::move(m));
}

// A Messages API tool ({"name", "description"?, "input_schema"}) as a chat tool.
ojson anthropic_tool(const ojson& v, size_t index) {
  const std::string p = fmt::format("tools[{}]", index);
  reject_unknown(object(v, p), p, {"type", "name", "description", "input_schema", "cache_control"});
  if (const ojson* t = member(v, "type"); t && string(*t, p + ".type") != "custom")
    invalid_param(p + ".type", fmt::format("{}.type '{}' is a server tool, not supported here", p, t->get<std::string>()),
                  "unsupported_value");
  const ojson* name = member(v, "name");
  if (!name || string(*name, p + ".name").empty()) invalid_param(p + ".name", p + ".name is required", "missing_required_parameter");
  const ojson* schema = member(v, "input_schema");
  if (!schema) invalid_param(p + ".input_schema", p + ".input_schema is required", "missing_required_parameter");
  ojson fn = {{"name", name->get<std::string>()}, {"parameters", object(*schema, p + ".input_schema")}};
  if (const ojson* d = member(v, "description")) fn["description"] = string(*d, p + ".description");
  return {{"type", "function"}, {"function", std::move(fn)}};
}

// --- OpenAI's Responses API (POST /v1/responses), read into the chat request above.

// An input item's content: a string, or input_text / output_text parts.
std::string response_content(const ojson& v, const std::string& p) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(p, "a string or an array of content parts", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string bp = fmt::format("{}[{}]", p, i);
    const std::string type = block_type(v[i], bp);
    if (type != "input_text" && type != "output_text")
      invalid_param(bp + ".type", fmt::format("content part type '{}' is not supported (input_text, output_text)", type),
                    "unsupported_value");
    reject_unknown(v[i], bp, {"type", "text", "annotations", "logprobs"});
    const ojson* t = member(v[i], "text");
    if (!t) invalid_param(bp + ".text", bp + ".text is required", "missing_required_parameter");
    if (!text.empty()) text += "\n";
    text += string(*t, bp + ".text");
  }
  return text;
}

// One input item as chat messages: a message, a function_call (joined to the assistant turn
// before it), or a function_call_output (a tool message).
void append_response_item(const ojson& v, size_t index, ojson& out) {
  const std::string p = fmt::format("input[{}]", index);
  object(v, p);
  const ojson* type_v = member(v, "type");
  const std::string type = type_v ? string(*type_v, p + ".type") : "message";
  if (type == "message") {
    reject_unknown(v, p, {"type", "role", "content", "id", "status"});
    const ojson* role_v = member(v, "role");
    if (!role_v) invalid_param(p + ".role", p + ".role is required", "missing_required_parameter");
    std::string role = string(*role_v, p + ".role");
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant")
      invalid_param(p + ".role", fmt::format("{}.role must be system, developer, user or assistant, is '{}'", p, role));
    const ojson* content = member(v, "content");
    if (!content) invalid_param(p + ".content", p + ".content is required", "missing_required_parameter");
    out.push_back({{"role", role}, {"content", response_content(*content, p + ".content")}});
  } else if (type == "function_call") {
    reject_unknown(v, p, {"type", "call_id", "name", "arguments", "id", "status"});
    const ojson* id = member(v, "call_id");
    const ojson* name = member(v, "name");
    const ojson* args = member(v, "arguments");
    if (!id) invalid_param(p + ".call_id", p + ".call_id is required", "missing_required_parameter");
    if (!name) invalid_param(p + ".name", p + ".name is required", "missing_required_parameter");
    const ojson call = {{"id", string(*id, p + ".call_id")},
                        {"type", "function"},
                        {"function", {{"name", string(*name, p + ".name")},
                                      {"arguments", args ? string(*args, p + ".arguments") : "{}"}}}};
    if (out.empty() || out.back()["role"] != "assistant") out.push_back({{"role", "assistant"}, {"content", ""}});
    out.back()["tool_calls"].push_back(call);
  } else if (type == "function_call_output") {
    reject_unknown(v, p, {"type", "call_id", "output", "id", "status"});
    const ojson* id = member(v, "call_id");
    const ojson* output = member(v, "output");
    if (!id) invalid_param(p + ".call_id", p + ".call_id is required", "missing_required_parameter");
    if (!output) invalid_param(p + ".output", p + ".output is required", "missing_required_parameter");
    out.push_back({{"role", "tool"}, {"tool_call_id", string(*id, p + ".call_id")},
                   {"content", response_content(*output, p + ".output")}});
  } else {
    invalid_param(p + ".type", fmt::format("input item type '{}' is not supported", type), "unsupported_value");
  }
}

// A Responses API function tool ({"type": "function", "name", "description"?, "parameters"?,
// "strict"?}) as a chat tool.
ojson response_tool(const ojson& v, size_t index) {
  const std::string p = fmt::format("tools[{}]", index);
  reject_unknown(object(v, p), p, {"type", "name", "description", "parameters", "strict"});
  const ojson* type = member(v, "type");
  if (!type) invalid_param(p + ".type", p + ".type is required", "missing_required_parameter");
  if (string(*type, p + ".type") != "function")
    invalid_param(p + ".type", fmt::format("{}.type '{}' is a built-in tool, not supported here", p, type->get<std::string>()),
                  "unsupported_value");
  const ojson* name = member(v, "name");
  if (!name || string(*name, p + ".name").empty()) invalid_param(p + ".name", p + ".name is required", "missing_required_parameter");
  ojson fn = {{"name", name->get<std::string>()}};
  if (const ojson* d = member(v, "description")) fn["description"] = string(*d, p + ".description");
  fn["parameters"] = member(v, "parameters") ? object(*member(v, "parameters"), p + ".parameters") : ojson::object();
  if (const ojson* s = member(v, "strict")) fn["strict"] = boolean(*s, p + ".strict");
  return {{"type", "function"}, {"function", std::move(fn)}};
}

}  // namespace

ojson parse_body(const std::string& body, int max_depth) {
  if (body.empty()) throw ApiError(400, "the request body is empty: a JSON object is expected", "invalid_request_error");
  if (size_t bad = utf8::first_invalid(body); bad != std::string::npos)
    throw ApiError(400, fmt::format("the request body is not valid UTF-8 (byte {})", bad), "invalid_request_error", "",
                   "invalid_utf8");
  // Depth is bounded while parsing (max_depth): the parsed value is walked recursively later
  // (template rendering, dump), so a hostile nesting must never get that far.
  ojson j;
  try {
    j = parse_json<ojson>(body, "the request body", {.max_depth = max_depth});
  } catch (const Error& e) {  // malformed, a number like 1e999, or nested too deep
    throw ApiError(400, e.what(), "invalid_request_error", "", "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, is {}", j.type_name()),
                                     "invalid_request_error");
  return j;
}

ChatRequest parse_chat_request(const ojson& body) {
  reject_unknown(body, "",
                 {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
                  "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "stream",
                  "stream_options", "n", "user", "tools", "tool_choice", "parallel_tool_calls", "logprobs",
                  "top_logprobs", "response_format", "metadata", "store", "service_tier", "logit_bias", "ignore_eos",
                  "speculative", "chat_template_kwargs"});
  ChatRequest r;
  r.options = read_options(body);
  const ojson* msgs = member(body, "messages");
  if (!msgs) invalid_param("messages", "messages is required", "missing_required_parameter");
  if (array(*msgs, "messages").empty()) invalid_param("messages", "messages must not be empty");
  r.messages = ojson::array();
  for (size_t i = 0; i < msgs->size(); ++i) r.messages.push_back(message((*msgs)[i], i));

  r.tools = read_tools(body, tool_schema);
  if (const ojson* c = member(body, "tool_choice")) {
    if (c->is_string()) {
      string_tool_choice(c->get<std::string>(), r);
    } else {
      reject_unknown(object(*c, "tool_choice"), "tool_choice", {"type", "function"});
      const ojson* type = member(*c, "type");
      if (!type || string(*type, "tool_choice.type") != "function")
        invalid_param("tool_choice.type", "tool_choice.type must be \"function\"");
      const ojson* f = member(*c, "function");
      if (!f) invalid_param("tool_choice.function", "tool_choice.function is required", "missing_required_parameter");
      reject_unknown(object(*f, "tool_choice.function"), "tool_choice.function", {"name"});
      const ojson* name = member(*f, "name");
      if (!name) invalid_param("tool_choice.function.name", "tool_choice.function.name is required", "missing_required_parameter");
      force_tools(r.tools, string(*name, "tool_choice.function.name"), "tool_choice.function.name", r.options);
    }
  }
  hold_auto_tools(r.tools, r.options);
  if (const ojson* v = member(body, "parallel_tool_calls")) boolean(*v, "parallel_tool_calls");
  if (const ojson* v = member(body, "logprobs"); v && boolean(*v, "logprobs"))
    invalid_param("logprobs", "logprobs are not supported", "unsupported_value");
  if (member(body, "top_logprobs")) invalid_param("top_logprobs", "top_logprobs is not supported", "unsupported_value");
  if (const ojson* v = member(body, "response_format")) {
    const ojson* type = member(object(*v, "response_format"), "type");
    const std::string t = type ? string(*type, "response_format.type") : "";
    if (t == "json_object") {
      r.options.json_object = true;
    } else if (t == "json_schema") {
      reject_unknown(*v, "response_format", {"type", "json_schema"});
      const ojson* js = member(*v, "json_schema");
      if (!js) invalid_param("response_format.json_schema", "response_format.json_schema is required", "missing_required_parameter");
      reject_unknown(object(*js, "response_format.json_schema"), "response_format.json_schema",
                     {"name", "schema", "strict", "description"});
      r.options.json_schema = compiled_schema(*js, "response_format.json_schema");
    } else if (t != "text") {
      invalid_param("response_format.type",
                    fmt::format("response_format.type must be text, json_object or json_schema, is '{}'", t));
    }
  }
  if (const ojson* v = member(body, "metadata")) object(*v, "metadata");
  if (const ojson* v = member(body, "store")) boolean(*v, "store");
  if (const ojson* v = member(body, "service_tier")) string(*v, "service_tier");
  if (const ojson* v = member(body, "chat_template_kwargs")) r.template_kwargs = template_kwargs(*v);
  return r;
}

TextCompletionRequest parse_completion_request(const ojson& body, int vocab) {
  reject_unknown(body, "",
                 {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "seed", "stop", "stream", "stream_options", "n", "user",
                  "echo", "suffix", "best_of", "logprobs", "logit_bias", "ignore_eos",
                  "speculative"});
  TextCompletionRequest r;
  r.options = read_options(body);
  if (!r.options.max_tokens) r.options.max_tokens = 16;  // OpenAI's default for completions
  const ojson* p = member(body, "prompt");
  if (!p) invalid_param("prompt", "prompt is required", "missing_required_parameter");
  // One prompt: a string, a list holding one string, a list of token ids or a list holding one.
  const ojson* one = p;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) one = &(*p)[0];
  if (one->is_string()) r.prompt = one->get<std::string>();
  else if (one->is_array() && !one->empty() && std::all_of(one->begin(), one->end(), [](const ojson& x) { return x.is_number(); })) {
    for (size_t i = 0; i < one->size(); ++i) r.prompt_ids.push_back(int(integer((*one)[i], fmt::format("prompt[{}]", i), 0, vocab - 1)));
  } else if (p->is_array() && p->size() > 1 && std::all_of(p->begin(), p->end(), [](const ojson& x) { return !x.is_number(); }))
    invalid_param("prompt", "prompt must be one prompt: batches of prompts are not supported", "unsupported_value");
  else
    wrong_type("prompt", "a string or an array of token ids", *p);
  if (r.prompt.empty() && r.prompt_ids.empty()) invalid_param("prompt", "prompt must not be empty");
  if (const ojson* v = member(body, "echo"); v && boolean(*v, "echo")) invalid_param("echo", "echo is not supported", "unsupported_value");
  if (member(body, "suffix")) invalid_param("suffix", "suffix is not supported", "unsupported_value");
  if (const ojson* v = member(body, "best_of"); v && integer(*v, "best_of", 1, 1 << 30) != 1)
    invalid_param("best_of", "best_of must be 1", "unsupported_value");
  if (member(body, "logprobs")) invalid_param("logprobs", "logprobs are not supported", "unsupported_value");
  return r;
}

ChatRequest parse_messages_request(const ojson& body, bool count_only) {
  reject_unknown(body, "",
                 {"model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "top_k",
                  "stream", "tools", "tool_choice", "metadata", "thinking", "service_tier", "ignore_eos", "speculative"});
  ChatRequest r;
  CompletionOptions& o = r.options;
  const ojson* model = member(body, "model");
  if (!model) invalid_param("model", "model is required", "missing_required_parameter");
  string(*model, "model");  // one model is served: any name selects it
  const ojson* max_tokens = member(body, "max_tokens");
  if (!max_tokens && !count_only) invalid_param("max_tokens", "max_tokens is required", "missing_required_parameter");
  if (max_tokens) o.max_tokens = int(integer(*max_tokens, "max_tokens", 1, 1 << 30));
  read_sampling(body, 1, o.sampling);  // Anthropic's temperature goes to 1
  if (const ojson* v = member(body, "stop_sequences")) {
    if (array(*v, "stop_sequences").size() > 16) invalid_param("stop_sequences", "stop_sequences holds at most 16 strings");
    for (size_t i = 0; i < v->size(); ++i) {
      o.stop.push_back(string((*v)[i], fmt::format("stop_sequences[{}]", i)));
      if (o.stop.back().empty()) invalid_param("stop_sequences", "stop sequences must not be empty");
    }
  }
  if (const ojson* v = member(body, "stream")) o.stream = boolean(*v, "stream");
  if (const ojson* v = member(body, "ignore_eos")) o.ignore_eos = boolean(*v, "ignore_eos");
  if (const ojson* v = member(body, "speculative")) o.speculative = speculative(*v);
  if (const ojson* v = member(body, "metadata")) object(*v, "metadata");
  if (const ojson* v = member(body, "service_tier")) string(*v, "service_tier");
  if (const ojson* v = member(body, "thinking")) {
    reject_unknown(object(*v, "thinking"), "thinking", {"type", "budget_tokens"});
    if (const ojson* type = member(*v, "type"); !type || string(*type, "thinking.type") != "disabled")
      invalid_param("thinking", "extended thinking is not supported: only {\"type\": \"disabled\"}", "unsupported_value");
  }
  r.messages = ojson::array();
  if (const ojson* sys = member(body, "system")) {
    const std::string text = text_of(*sys, "system");
    if (!text.empty()) r.messages.push_back({{"role", "system"}, {"content", text}});
  }
  const ojson* msgs = member(body, "messages");
  if (!msgs) invalid_param("messages", "messages is required", "missing_required_parameter");
  if (array(*msgs, "messages").empty()) invalid_param("messages", "messages must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) append_anthropic_message((*msgs)[i], i, r.messages);
  r.tools = read_tools(body, anthropic_tool);
  if (const ojson* c = member(body, "tool_choice")) {
    reject_unknown(object(*c, "tool_choice"), "tool_choice", {"type", "name", "disable_parallel_tool_use"});
    const ojson* type = member(*c, "type");
    if (!type) invalid_param("tool_choice.type", "tool_choice.type is required", "missing_required_parameter");
    const std::string choice = string(*type, "tool_choice.type");
    if (choice == "none") {
      r.tools = nullptr;
    } else if (choice == "any") {
      force_tools(r.tools, "", "tool_choice", r.options);
    } else if (choice == "tool") {
      const ojson* name = member(*c, "name");
      if (!name) invalid_param("tool_choice.name", "tool_choice.name is required", "missing_required_parameter");
      force_tools(r.tools, string(*name, "tool_choice.name"), "tool_choice.name", r.options);
    } else if (choice != "auto") {
      invalid_param("tool_choice.type", fmt::format("tool_choice.type must be auto, any, tool or none, is '{}'", choice));
    }
    if (const ojson* d = member(*c, "disable_parallel_tool_use")) boolean(*d, "tool_choice.disable_parallel_tool_use");
  }
  return r;
}

ChatRequest parse_responses_request(const ojson& body) {
  reject_unknown(body, "",
                 {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "tools",
                  "tool_choice", "parallel_tool_calls", "text", "store", "metadata", "user", "previous_response_id",
                  "reasoning", "truncation", "include", "service_tier", "top_k", "ignore_eos", "speculative"});
  ChatRequest r;
  CompletionOptions& o = r.options;
  if (const ojson* v = member(body, "model")) string(*v, "model");
  if (const ojson* v = member(body, "max_output_tokens")) o.max_tokens = int(integer(*v, "max_output_tokens", 1, 1 << 30));
  read_sampling(body, 2, o.sampling);
  if (const ojson* v = member(body, "stream")) o.stream = boolean(*v, "stream");
  if (const ojson* v = member(body, "ignore_eos")) o.ignore_eos = boolean(*v, "ignore_eos");
  if (const ojson* v = member(body, "speculative")) o.speculative = speculative(*v);
  if (const ojson* v = member(body, "parallel_tool_calls")) boolean(*v, "parallel_tool_calls");
  if (const ojson* v = member(body, "metadata")) object(*v, "metadata");
  if (const ojson* v = member(body, "user")) string(*v, "user");
  if (const ojson* v = member(body, "service_tier")) string(*v, "service_tier");
  if (const ojson* v = member(body, "truncation"); v && string(*v, "truncation") != "disabled")
    invalid_param("truncation", "only truncation \"disabled\" is supported", "unsupported_value");
  if (const ojson* v = member(body, "store")) r.store = boolean(*v, "store");
  if (const ojson* v = member(body, "previous_response_id")) {
    r.previous_response_id = string(*v, "previous_response_id");
    if (r.previous_response_id.empty()) invalid_param("previous_response_id", "previous_response_id must not be empty");
  }
  if (const ojson* v = member(body, "include"); v && !array(*v, "include").empty())
    invalid_param("include", "include is not supported", "unsupported_value");
  if (const ojson* v = member(body, "reasoning")) {
    reject_unknown(object(*v, "reasoning"), "reasoning", {"effort", "summary"});
    if (const ojson* e = member(*v, "effort")) string(*e, "reasoning.effort");  // the template decides
    if (const ojson* e = member(*v, "summary")) string(*e, "reasoning.summary");
  }
  if (const ojson* v = member(body, "text")) {
    reject_unknown(object(*v, "text"), "text", {"format", "verbosity"});
    if (const ojson* f = member(*v, "format")) {
      const ojson* type = member(object(*f, "text.format"), "type");
      const std::string t = type ? string(*type, "text.format.type") : "";
      if (t == "json_object") {
        o.json_object = true;
      } else if (t == "json_schema") {
        reject_unknown(*f, "text.format", {"type", "name", "schema", "strict", "description"});
        o.json_schema = compiled_schema(*f, "text.format");
      } else if (t != "text") {
        invalid_param("text.format.type", fmt::format("text.format.type must be text, json_object or json_schema, is '{}'", t));
      }
    }
  }
  r.messages = ojson::array();
  if (const ojson* v = member(body, "instructions")) r.messages.push_back({{"role", "system"}, {"content", string(*v, "instructions")}});
  const ojson* input = member(body, "input");
  if (!input) invalid_param("input", "input is required", "missing_required_parameter");
  if (input->is_string()) {
    r.messages.push_back({{"role", "user"}, {"content", input->get<std::string>()}});
  } else {
    if (array(*input, "input").empty()) invalid_param("input", "input must not be empty");
    for (size_t i = 0; i < input->size(); ++i) append_response_item((*input)[i], i, r.messages);
  }
  r.tools = read_tools(body, response_tool);
  if (const ojson* c = member(body, "tool_choice")) {
    if (c->is_string()) {
      string_tool_choice(c->get<std::string>(), r);
    } else {
      reject_unknown(object(*c, "tool_choice"), "tool_choice", {"type", "name"});
      const ojson* type = member(*c, "type");
      if (!type || string(*type, "tool_choice.type") != "function")
        invalid_param("tool_choice.type", "tool_choice.type must be \"function\"");
      const ojson* name = member(*c, "name");
      if (!name) invalid_param("tool_choice.name", "tool_choice.name is required", "missing_required_parameter");
      force_tools(r.tools, string(*name, "tool_choice.name"), "tool_choice.name", o);
    }
  }
  hold_auto_tools(r.tools, o);
  return r;
}

}  // namespace ms
