#include "server/server.h"

#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include "server/api_error.h"
#include "server/chat_output.h"
#include "server/dashboard.h"
#include "server/metrics.h"
#include "util/error.h"

namespace ms {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

// Threads that parse requests, render templates and tokenize prompts (the I/O thread never does).
constexpr size_t kRequestWorkers = 2;

ResidentBytes weight_bytes(const Model& m) {
  ResidentBytes b;
  b.dense = m.weights().dense_bytes;
  b.experts = m.weights().expert_bytes;
  return b;
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

HttpResponse json_response(int status, const ojson& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return r;
}

HttpResponse error_response(const ApiError& e) { return json_response(e.status, e.to_json()); }

// An OpenAI error body ({"error": {"message", "type", "param", "code"}}) as Anthropic's, whose
// error types go by status; the member at fault stays in the message.
std::string anthropic_error(int status, const std::string& openai_body) {
  const ojson j = ojson::parse(openai_body, nullptr, false);
  std::string message = j.is_object() && j.contains("error") && j["error"].is_object() && j["error"]["message"].is_string()
                            ? j["error"]["message"].get<std::string>()
                            : openai_body;
  const char* type = status == 401   ? "authentication_error"
                     : status == 403 ? "permission_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 429 ? "rate_limit_error"
                     : status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error"
                                     : "invalid_request_error";
  return ojson{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}.dump();
}

// A path segment with its %XX escapes decoded (a client escapes a model id such as "a/b"); a
// malformed escape stays as it is.
std::string percent_decoded(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(uint8_t(s[i + 1])) && std::isxdigit(uint8_t(s[i + 2]))) {
      out += char(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

HttpResponse text_response(std::string body, const char* content_type) {
  HttpResponse r;
  r.content_type = content_type;
  r.body = std::move(body);
  return r;
}

ojson usage(const GenerationResult& r) {
  const int completion = int(r.tokens.size());
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", r.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", r.reused_tokens}}}};
}

std::string sse(const ojson& j) {
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

std::string basename_of(const std::string& dir) {
  std::filesystem::path p(dir);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

// Constant time in the length of `want`: no early exit on the first differing byte.
bool same_secret(const std::string& got, const std::string& want) {
  unsigned diff = got.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i) diff |= unsigned(uint8_t(want[i]) ^ uint8_t(i < got.size() ? got[i] : 0));
  return diff == 0;
}

// The password of an 'Authorization: Basic' header (base64 of "user:password"), or "".
std::string basic_password(const std::string& header) {
  constexpr std::string_view kScheme = "Basic ";
  if (header.compare(0, kScheme.size(), kScheme) != 0) return "";
  std::string decoded;
  unsigned bits = 0;
  int have = 0;
  for (char c : std::string_view(header).substr(kScheme.size())) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else if (c == '=') break;
    else return "";
    bits = (bits << 6) | unsigned(v), have += 6;
    if (have >= 8) decoded += char((bits >> (have -= 8)) & 0xFF);
  }
  const size_t colon = decoded.find(':');
  return colon == std::string::npos ? "" : decoded.substr(colon + 1);
}

// The key as OpenAI clients send it (Authorization: Bearer), Anthropic's (x-api-key), or a
// browser's (Authorization: Basic, the key as the password, any user name: the dashboard).
bool authorized(const HttpRequest& req, const std::string& key) {
  const std::string auth = req.header("Authorization");
  const bool bearer = same_secret(auth, "Bearer " + key);
  const bool x_api_key = same_secret(req.header("x-api-key"), key);
  const bool basic = same_secret(basic_password(auth), key);
  return bearer || x_api_key || basic;
}

// A chat request's prompt: rendered by the model's template, and tokenized with the request's
// own text (messages, tools, chat_template_kwargs) as plain text, so that only the template's
// markers become special tokens (a user's "<|im_end|>" cannot forge a turn).
std::vector<int> chat_prompt_ids(const Engine& engine, const ChatRequest& cr) {
  const ChatTemplate* tmpl = engine.chat_template();
  if (!tmpl) throw ApiError(400, "this model has no chat template: use /v1/completions", "invalid_request_error");
  MarkedText prompt;
  try {
    prompt = tmpl->render_marked(cr.messages, cr.tools, true, cr.template_kwargs);
  } catch (const std::exception& e) {
    throw ApiError(400, fmt::format("the chat template cannot render these messages: {}", e.what()), "invalid_request_error",
                   "messages");
  }
  return engine.tokenizer().encode(prompt);
}

}  // namespace

// What a response body is made of, as generation goes: streamed (SSE) or whole (one JSON object
// at the end), in one API's shapes.
class HttpServer::Formatter {
 public:
  explicit Formatter(bool stream) : stream_(stream) {}
  virtual ~Formatter() = default;
  const char* content_type() const { return stream_ ? "text/event-stream" : "application/json"; }
  virtual std::string begin() = 0;
  // The next piece of the answer: a stream's events for it, or "" while a whole answer gathers it.
  std::string text(const std::string& piece) {
    if (stream_) return streamed(piece);
    text_ += piece;
    return "";
  }
  virtual std::string end(const GenerationResult& r) = 0;
  // A failure: the whole answer where it comes before the headers went out (the transport then
  // sends 500), else reported in the body after a 200.
  virtual std::string error(const std::string& message) = 0;
  // What a quiet stream sends (SSE comments or pings). A whole answer has none: its head goes out
  // with it, so that a client's own timeout and abort work as its documentation says (the
  // transport notices a client that leaves without writing to it).
  virtual std::string heartbeat() const = 0;

 protected:
  virtual std::string streamed(const std::string& piece) = 0;  // text()'s events of a stream

  const bool stream_;
  std::string text_;  // a whole answer: everything so far
};

// OpenAI chat or text completion.
class HttpServer::OpenAIFormat final : public HttpServer::Formatter {
 public:
  OpenAIFormat(std::string model, bool chat, bool stream, bool include_usage, bool parse_tools)
      : Formatter(stream), model_(std::move(model)), chat_(chat), include_usage_(include_usage), parse_tools_(parse_tools),
        deltas_(parse_tools), id_(random_id(chat ? "chatcmpl-" : "cmpl-")), created_(std::time(nullptr)) {}

  std::string begin() override {
    if (!stream_ || !chat_) return "";
    return sse(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
  }

  std::string streamed(const std::string& piece) override {
    if (!chat_) return sse(text_chunk(piece, nullptr));
    std::string out;
    for (const ojson& d : deltas_.feed(piece)) out += sse(chunk(d, nullptr));
    return out;
  }

  std::string end(const GenerationResult& r) override {
    std::string finish = r.finish_reason;
    if (!stream_) return whole(r, finish);
    std::string out;
    if (chat_) {
      for (const ojson& d : deltas_.finish()) out += sse(chunk(d, nullptr));
      if (deltas_.made_tool_calls() && finish == "stop") finish = "tool_calls";
      out += sse(chunk(ojson::object(), finish));
    } else {
      out += sse(text_chunk("", finish));
    }
    if (include_usage_) {
      ojson u = envelope();
      u["choices"] = ojson::array();
      u["usage"] = usage(r);
      out += sse(u);
    }
    return out + "data: [DONE]\n\n";
  }

  std::string error(const std::string& message) override {
    ApiError e(500, "generation failed: " + message, "server_error");
    return stream_ ? sse(e.to_json()) + "data: [DONE]\n\n" : e.to_json().dump();
  }

  std::string heartbeat() const override { return stream_ ? ": keep-alive\n\n" : ""; }

 private:
  ojson envelope() const {
    ojson j = {{"id", id_},
               {"object", chat_ ? (stream_ ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
               {"created", created_},
               {"model", model_}};
    return j;
  }

  ojson chunk(const ojson& delta, const ojson& finish) const {
    ojson j = envelope();
    j["choices"] = ojson::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}});
    if (include_usage_) j["usage"] = nullptr;
    return j;
  }

  ojson text_chunk(const std::string& text, const ojson& finish) const {
    ojson j = envelope();
    j["choices"] = ojson::array({{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}});
    if (include_usage_) j["usage"] = nullptr;
    return j;
  }

  std::string whole(const GenerationResult& r, std::string finish) const {
    ojson j = envelope();
    ojson choice = {{"index", 0}};
    if (chat_) choice["message"] = chat_message(text_, parse_tools_, &finish);
    else choice["text"] = text_;
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = finish;
    j["choices"] = ojson::array({std::move(choice)});
    j["usage"] = usage(r);
    return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }

  std::string model_;
  bool chat_, include_usage_, parse_tools_;
  ChatDeltaStream deltas_;
  std::string id_;
  std::time_t created_;
};

// The Anthropic Messages API: a message of content blocks (text, tool_use), whole or as its SSE
// events (message_start, content_block_start/delta/stop, message_delta, message_stop; ping
// while quiet).
class HttpServer::MessagesFormat final : public HttpServer::Formatter {
 public:
  MessagesFormat(std::string model, bool stream, bool parse_tools, int prompt_tokens)
      : Formatter(stream), model_(std::move(model)), parse_tools_(parse_tools), prompt_tokens_(prompt_tokens),
        deltas_(parse_tools, [] { return random_id("toolu_"); }), id_(random_id("msg_")) {}

  std::string begin() override {
    if (!stream_) return "";
    ojson m = message(ojson::array());
    m["usage"] = {{"input_tokens", prompt_tokens_}, {"output_tokens", 0}};
    return event("message_start", {{"type", "message_start"}, {"message", m}});
  }

  std::string streamed(const std::string& piece) override { return blocks(deltas_.feed(piece)); }

  std::string end(const GenerationResult& r) override {
    if (!stream_) return whole(r);
    std::string out = blocks(deltas_.finish()) + close_text();
    out += event("message_delta", {{"type", "message_delta"},
                                   {"delta", {{"stop_reason", stop_reason(r, deltas_.made_tool_calls())},
                                              {"stop_sequence", stop_sequence(r)}}},
                                   {"usage", usage_of(r)}});
    return out + event("message_stop", {{"type", "message_stop"}});
  }

  std::string error(const std::string& message) override {
    const ojson e = {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", "generation failed: " + message}}}};
    return stream_ ? event("error", e) : e.dump();
  }

  std::string heartbeat() const override { return stream_ ? event("ping", {{"type", "ping"}}) : ""; }

 private:
  static std::string event(const char* name, const ojson& data) {
    return fmt::format("event: {}\ndata: {}\n\n", name, data.dump(-1, ' ', false, ojson::error_handler_t::replace));
  }

  ojson message(ojson content) const {
    return {{"id", id_},       {"type", "message"},      {"role", "assistant"},    {"model", model_},
            {"content", std::move(content)}, {"stop_reason", nullptr}, {"stop_sequence", nullptr}};
  }

  ojson usage_of(const GenerationResult& r) const {
    return {{"input_tokens", r.prompt_tokens}, {"output_tokens", int(r.tokens.size())},
            {"cache_read_input_tokens", r.reused_tokens}};
  }

  static std::string stop_reason(const GenerationResult& r, bool tool_calls) {
    if (r.finish_reason == "length") return "max_tokens";
    if (r.finish_reason != "stop") return r.finish_reason;  // timeout, cancelled: as the OpenAI API says them
    if (!r.stop_string.empty()) return "stop_sequence";
    return tool_calls ? "tool_use" : "end_turn";
  }

  static ojson stop_sequence(const GenerationResult& r) {
    return r.stop_string.empty() ? ojson(nullptr) : ojson(r.stop_string);
  }

  // A tool call's arguments as the tool_use block's input (an object; text the model wrote that
  // is no JSON object stays readable under "arguments").
  static ojson input_of(const std::string& arguments) {
    ojson j = ojson::parse(arguments, nullptr, false);
    return j.is_object() ? j : ojson{{"arguments", arguments}};
  }

  std::string whole(const GenerationResult& r) const {
    std::string finish = r.finish_reason;
    const ojson msg = chat_message(text_, parse_tools_, &finish, [] { return random_id("toolu_"); });
    ojson content = ojson::array();
    if (const std::string t = msg["content"].is_string() ? msg["content"].get<std::string>() : ""; !t.empty())
      content.push_back({{"type", "text"}, {"text", t}});
    bool calls = false;
    if (msg.contains("tool_calls"))
      for (const ojson& c : msg["tool_calls"]) {
        content.push_back({{"type", "tool_use"}, {"id", c["id"]},
                           {"name", c["function"]["name"]}, {"input", input_of(c["function"]["arguments"])}});
        calls = true;
      }
    ojson m = message(std::move(content));
    m["stop_reason"] = stop_reason(r, calls);
    m["stop_sequence"] = stop_sequence(r);
    m["usage"] = usage_of(r);
    return m.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }

  // The events of chat deltas: text goes into an open text block; each completed tool call is a
  // tool_use block of its own (start, its whole input as one input_json_delta, stop).
  std::string blocks(const std::vector<ojson>& deltas) {
    std::string out;
    for (const ojson& d : deltas) {
      if (d.contains("content")) {
        const std::string t = d["content"].get<std::string>();
        if (t.empty()) continue;
        if (!text_open_)
          out += event("content_block_start", {{"type", "content_block_start"}, {"index", index_},
                                               {"content_block", {{"type", "text"}, {"text", ""}}}}),
              text_open_ = true;
        out += event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                             {"delta", {{"type", "text_delta"}, {"text", t}}}});
      }
      if (d.contains("tool_calls"))
        for (const ojson& c : d["tool_calls"]) {
          out += close_text();
          out += event("content_block_start",
                       {{"type", "content_block_start"}, {"index", index_},
                        {"content_block", {{"type", "tool_use"}, {"id", c["id"]}, {"name", c["function"]["name"]},
                                           {"input", ojson::object()}}}});
          out += event("content_block_delta",
                       {{"type", "content_block_delta"}, {"index", index_},
                        {"delta", {{"type", "input_json_delta"},
                                   {"partial_json", input_of(c["function"]["arguments"]).dump()}}}});
          out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
          ++index_;
        }
    }
    return out;
  }

  std::string close_text() {
    if (!text_open_) return "";
    text_open_ = false;
    return event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_++}});
  }

  std::string model_;
  bool parse_tools_;
  int prompt_tokens_;
  ChatDeltaStream deltas_;
  std::string id_;
  int index_ = 0;     // the content block being written
  bool text_open_ = false;
};

// OpenAI's Responses API: a response whose output holds a message (output_text) and
// function_call items, whole or as its SSE events (response.created, output_item.added,
// content_part.added, output_text.delta ... done, function_call_arguments.delta / done,
// output_item.done, response.completed or response.incomplete), each with a sequence_number.
class HttpServer::ResponsesFormat final : public HttpServer::Formatter {
 public:
  // on_done(id, message): the answer as the chat's assistant message, once it is complete.
  using OnDone = std::function<void(const std::string& id, const ojson& message)>;
  ResponsesFormat(std::string model, bool stream, bool parse_tools, std::optional<int> max_output_tokens,
                  std::string previous, OnDone on_done)
      : Formatter(stream), model_(std::move(model)), parse_tools_(parse_tools), max_output_tokens_(max_output_tokens),
        previous_(std::move(previous)), on_done_(std::move(on_done)),
        deltas_(parse_tools, [] { return random_id("call_"); }), id_(random_id("resp_")),
        created_(std::time(nullptr)) {}

  std::string begin() override {
    if (!stream_) return "";
    const ojson r = response("in_progress", nullptr, nullptr);
    return event({{"type", "response.created"}, {"response", r}}) + event({{"type", "response.in_progress"}, {"response", r}});
  }

  std::string streamed(const std::string& piece) override { return items(deltas_.feed(piece)); }

  std::string end(const GenerationResult& r) override {
    if (!stream_) {
      std::string finish = r.finish_reason;
      const ojson msg = chat_message(text_, parse_tools_, &finish, [] { return random_id("call_"); });
      if (const std::string t = msg["content"].is_string() ? msg["content"].get<std::string>() : ""; !t.empty())
        output_.push_back(message_item(t, "completed"));
      if (msg.contains("tool_calls"))
        for (const ojson& c : msg["tool_calls"]) output_.push_back(call_item(c, "completed"));
      done();
      return final_response(r).dump(-1, ' ', false, ojson::error_handler_t::replace);
    }
    std::string out = items(deltas_.finish()) + close_text();
    done();
    const ojson f = final_response(r);
    return out + event({{"type", f["status"] == "completed" ? "response.completed" : "response.incomplete"}, {"response", f}});
  }

  std::string error(const std::string& message) override {
    const ojson e = {{"type", "server_error"}, {"code", "server_error"}, {"message", "generation failed: " + message}};
    if (!stream_) return ojson{{"error", e}}.dump();
    return event({{"type", "error"}, {"code", "server_error"}, {"message", e["message"]}, {"param", nullptr}});
  }

  std::string heartbeat() const override { return stream_ ? ": keep-alive\n\n" : ""; }

 private:
  std::string event(ojson data) {
    data["sequence_number"] = seq_++;
    return fmt::format("event: {}\ndata: {}\n\n", data["type"].get<std::string>(),
                       data.dump(-1, ' ', false, ojson::error_handler_t::replace));
  }

  // The output as the chat's assistant message (the same call ids), to on_done.
  void done() const {
    if (!on_done_) return;
    ojson m = {{"role", "assistant"}, {"content", ""}};
    for (const ojson& item : output_) {
      if (item["type"] == "message") m["content"] = m["content"].get<std::string>() + item["content"][0]["text"].get<std::string>();
      else m["tool_calls"].push_back({{"id", item["call_id"]}, {"type", "function"},
                                      {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    }
    on_done_(id_, m);
  }

  ojson response(const char* status, ojson incomplete, ojson usage) const {
    return {{"id", id_},
            {"object", "response"},
            {"created_at", created_},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", std::move(incomplete)},
            {"instructions", nullptr},
            {"max_output_tokens", max_output_tokens_ ? ojson(*max_output_tokens_) : ojson(nullptr)},
            {"model", model_},
            {"output", output_},
            {"parallel_tool_calls", true},
            {"previous_response_id", previous_.empty() ? ojson(nullptr) : ojson(previous_)},
            {"tool_choice", "auto"},
            {"tools", ojson::array()},
            {"store", false},
            {"usage", std::move(usage)}};
  }

  ojson final_response(const GenerationResult& r) const {
    const int out_tokens = int(r.tokens.size());
    const ojson usage = {{"input_tokens", r.prompt_tokens},
                         {"input_tokens_details", {{"cached_tokens", r.reused_tokens}}},
                         {"output_tokens", out_tokens},
                         {"output_tokens_details", {{"reasoning_tokens", 0}}},
                         {"total_tokens", r.prompt_tokens + out_tokens}};
    if (r.finish_reason == "length") return response("incomplete", {{"reason", "max_output_tokens"}}, usage);
    if (r.finish_reason == "timeout" || r.finish_reason == "cancelled")
      return response("incomplete", {{"reason", r.finish_reason}}, usage);
    return response("completed", nullptr, usage);
  }

  ojson message_item(const std::string& text, const char* status) const {
    return {{"type", "message"}, {"id", text_id_}, {"status", status}, {"role", "assistant"},
            {"content", ojson::array({{{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}}})}};
  }

  static ojson call_item(const ojson& c, const char* status) {
    return {{"type", "function_call"}, {"id", "fc_" + c["id"].get<std::string>().substr(5)}, {"call_id", c["id"]},
            {"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]}, {"status", status}};
  }

  // The events of chat deltas: text goes into an open message item; each completed tool call is
  // a function_call item of its own (added, its arguments as one delta, done).
  std::string items(const std::vector<ojson>& deltas) {
    std::string out;
    for (const ojson& d : deltas) {
      if (d.contains("content") && !d["content"].get<std::string>().empty()) {
        const std::string t = d["content"].get<std::string>();
        const int index = int(output_.size());
        if (!text_open_) {
          text_open_ = true;
          ojson item = message_item("", "in_progress");
          item["content"] = ojson::array();
          out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
          out += event({{"type", "response.content_part.added"}, {"item_id", text_id_}, {"output_index", index},
                        {"content_index", 0}, {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}}});
        }
        streamed_text_ += t;
        out += event({{"type", "response.output_text.delta"}, {"item_id", text_id_}, {"output_index", index},
                      {"content_index", 0}, {"delta", t}});
      }
      if (d.contains("tool_calls"))
        for (const ojson& c : d["tool_calls"]) {
          out += close_text();
          const ojson item = call_item(c, "completed");
          ojson added = item;
          added["arguments"] = "", added["status"] = "in_progress";
          const int index = int(output_.size());
          out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", added}});
          out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", item["id"]},
                        {"output_index", index}, {"delta", item["arguments"]}});
          out += event({{"type", "response.function_call_arguments.done"}, {"item_id", item["id"]},
                        {"output_index", index}, {"arguments", item["arguments"]}});
          out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
          output_.push_back(item);
        }
    }
    return out;
  }

  std::string close_text() {
    if (!text_open_) return "";
    text_open_ = false;
    const int index = int(output_.size());
    const ojson item = message_item(streamed_text_, "completed");
    std::string out = event({{"type", "response.output_text.done"}, {"item_id", text_id_}, {"output_index", index},
                             {"content_index", 0}, {"text", streamed_text_}});
    out += event({{"type", "response.content_part.done"}, {"item_id", text_id_}, {"output_index", index},
                  {"content_index", 0}, {"part", item["content"][0]}});
    out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
    output_.push_back(item);
    streamed_text_.clear();
    text_id_ = random_id("msg_");
    return out;
  }

  std::string model_;
  bool parse_tools_;
  std::optional<int> max_output_tokens_;
  std::string previous_;
  OnDone on_done_;
  ChatDeltaStream deltas_;
  std::string id_, text_id_ = random_id("msg_");
  std::time_t created_;
  std::string streamed_text_;
  ojson output_ = ojson::array();  // the items done so far
  bool text_open_ = false;
  int seq_ = 0;
};

HttpServer::HttpServer(const Engine& engine, ServerOptions opts)
    : engine_(engine),
      opts_(std::move(opts)),
      stats_(engine.model().config(), weight_bytes(engine.model()), &engine.model()),
      session_(engine, &stats_),
      queue_(session_, stats_, opts_.queue_limit),
      http_(std::make_unique<HttpTransport>(opts_.http, kRequestWorkers)) {
  if (opts_.model_name.empty()) opts_.model_name = basename_of(engine.dir());
  stats_.set_speculative_default(engine.speculative());
  add_routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() { return http_->bind(opts_.host, opts_.port); }

void HttpServer::serve() { http_->run(); }

void HttpServer::shutdown() {
  if (draining_.exchange(true)) return;
  queue_.close();
  const auto drain = std::chrono::milliseconds(int64_t(opts_.drain_timeout_s * 1000));
  if (!queue_.wait_idle(drain)) {
    queue_.cancel_all();
    queue_.wait_idle(std::chrono::hours(1));
  }
  // Let the I/O thread write what the finished generations made before the sockets close.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (open_responses_ > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  http_->stop();
}

void HttpServer::StoredResponses::keep(const std::string& id, ojson turns) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.emplace_back(id, std::move(turns));
  if (kept_.size() > kKept) kept_.pop_front();
}

std::optional<ojson> HttpServer::StoredResponses::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, turns] : kept_)
    if (k == id) return turns;
  return std::nullopt;
}

ojson HttpServer::model_object() const {
  return {{"id", opts_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "moestream"},
          {"max_model_len", engine_.model().config().max_positions}};
}

std::string HttpServer::stats_json() const {
  ojson j = {{"model", opts_.model_name}};
  ojson s = to_json(stats_.snapshot());
  j["queue"] = {{"waiting", queue_.waiting()}, {"running", queue_.busy() ? 1 : 0}, {"limit", opts_.queue_limit}};
  const HttpCounters h = http_->counters();
  j["http"] = {{"open", h.open}, {"accepted", h.accepted}, {"refused", h.refused}, {"timed_out", h.timed_out}, {"rejected", h.rejected}};
  ojson by_api = ojson::object();
  for (size_t i = 0; i < kApis; ++i) by_api[kApiNames[i]] = api_requests_[i].load();
  j["requests_by_api"] = std::move(by_api);
  for (auto it = s.begin(); it != s.end(); ++it) j[it.key()] = it.value();
  return j.dump();
}

QueueState HttpServer::queue_state() const { return {queue_.waiting(), opts_.queue_limit, queue_.busy()}; }

void HttpServer::add_routes() {
  HttpTransport& h = *http_;
  // Checked on a request's head, before its body is read.
  h.set_admission([this](const HttpRequest& req) -> std::optional<HttpResponse> {
    if (req.path == "/health") return std::nullopt;
    if (!opts_.api_key.empty() && !authorized(req, opts_.api_key)) {
      HttpResponse r = error_response(ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                                               "invalid_request_error", "", "invalid_api_key"));
      // A browser asks for the key (as the password) where the dashboard's page is opened.
      if (req.path == "/dashboard" && opts_.dashboard) r.headers.push_back({"WWW-Authenticate", "Basic realm=\"moestream\", charset=\"UTF-8\""});
      return r;
    }
    if (draining_ && req.method == "POST")
      return error_response(ApiError(503, "the server is shutting down", "server_error", "", "shutting_down"));
    return std::nullopt;
  });
  // The transport's own refusals (unknown path, limits, malformed requests) in OpenAI's form.
  h.set_error_body([](int status, const std::string& message, const std::string& code) {
    const char* type = status >= 500 ? "server_error" : "invalid_request_error";
    return error_response(ApiError(status, message, type, "", code));
  });

  // Each API's requests are counted (/api/stats, /metrics), whatever becomes of them.
  auto guarded = [this](HttpResponse (HttpServer::*handler)(const HttpRequest&), Api api) {
    return [this, handler, api](const HttpRequest& req) {
      ++api_requests_[size_t(api)];
      try {
        return (this->*handler)(req);
      } catch (const ApiError& e) {
        if (e.status == 429) stats_.record_rejected();
        return error_response(e);
      }
    };
  };
  using Runs = HttpTransport::Runs;
  h.route("POST", "/v1/chat/completions", guarded(&HttpServer::chat_completions, Api::ChatCompletions), Runs::OnWorker);
  h.route("POST", "/v1/completions", guarded(&HttpServer::completions, Api::Completions), Runs::OnWorker);
  // Anthropic's errors have their own shape: {"type": "error", "error": {"type", "message"}}.
  auto anthropic = [guarded](HttpResponse (HttpServer::*handler)(const HttpRequest&), Api api) {
    return [handler = guarded(handler, api)](const HttpRequest& r) {
      HttpResponse res = handler(r);
      if (res.status >= 400 && !res.stream) res.body = anthropic_error(res.status, res.body);
      return res;
    };
  };
  h.route("POST", "/v1/messages", anthropic(&HttpServer::messages, Api::Messages), Runs::OnWorker);
  h.route("POST", "/v1/messages/count_tokens", anthropic(&HttpServer::count_tokens, Api::CountTokens), Runs::OnWorker);
  h.route("POST", "/v1/responses", guarded(&HttpServer::responses, Api::Responses), Runs::OnWorker);
  h.route("GET", "/v1/models", [this](const HttpRequest&) {
    return json_response(200, {{"object", "list"}, {"data", ojson::array({model_object()})}});
  }, Runs::OnIoThread);
  h.route("GET", "/v1/models/*", [this](const HttpRequest& r) {
    const std::string id = percent_decoded(r.path.substr(std::strlen("/v1/models/")));
    if (id != opts_.model_name)
      return error_response(ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'",
                                                      id.substr(0, 256), opts_.model_name),
                                     "invalid_request_error", "model", "model_not_found"));
    return json_response(200, model_object());
  }, Runs::OnIoThread);
  h.route("GET", "/health", [this](const HttpRequest&) {
    return draining_ ? json_response(503, {{"status", "stopping"}}) : json_response(200, {{"status", "ok"}});
  }, Runs::OnIoThread);
  h.route("GET", "/api/stats", [this](const HttpRequest&) { return text_response(stats_json(), "application/json"); },
          Runs::OnIoThread);
  if (opts_.dashboard) {
    h.route("GET", "/dashboard", [](const HttpRequest&) {
      return text_response(std::string(dashboard_page()), "text/html; charset=utf-8");
    }, Runs::OnIoThread);
    h.route("GET", "/api/dashboard", [this](const HttpRequest&) {
      return text_response(dashboard_json(stats_.snapshot(), engine_.model(), queue_state()).dump(), "application/json");
    }, Runs::OnIoThread);
  }
  h.route("GET", "/metrics", [this](const HttpRequest&) {
    std::string text = prometheus_text(stats_.snapshot(), queue_state(), http_->counters());
    text += "# HELP moestream_api_requests_total Requests received per API.\n# TYPE moestream_api_requests_total counter\n";
    for (size_t i = 0; i < kApis; ++i)
      text += fmt::format("moestream_api_requests_total{{api=\"{}\"}} {}\n", kApiNames[i], api_requests_[i].load());
    return text_response(std::move(text), "text/plain; version=0.0.4");
  }, Runs::OnIoThread);
}

GenerationRequest HttpServer::generation_request(std::vector<int> prompt, const CompletionOptions& o, const char* prompt_param) const {
  const int context = engine_.model().config().max_positions;
  const int n = int(prompt.size());
  if (n == 0) invalid_param(prompt_param, "the prompt is empty after tokenization");
  if (n >= context)
    invalid_param(prompt_param,
                  fmt::format("the prompt is {} tokens; the model's context is {} tokens (max_position_embeddings), "
                              "and at least one must be left to generate",
                              n, context),
                  "context_length_exceeded");
  GenerationRequest g;
  g.prompt = std::move(prompt);
  // What does not fit in the context is cut, with finish_reason "length".
  g.max_tokens = std::min(o.max_tokens.value_or(context), context - n);
  g.sampling = o.sampling;
  g.stop = o.stop;
  g.ignore_eos = o.ignore_eos;
  g.json_object = o.json_object;
  g.forced_tools = o.forced_tools;
  g.forced_tool_schemas = o.forced_tool_schemas;
  g.auto_tools = o.auto_tools;
  g.auto_tool_schemas = o.auto_tool_schemas;
  g.json_schema = o.json_schema;
  g.speculative = o.speculative;
  g.deadline = Clock::now() + std::chrono::milliseconds(int64_t(opts_.request_timeout_s * 1000));
  try {
    g.sampling.validate();
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "invalid_request_error");
  }
  if (g.speculative) try {
      g.speculative = resolve_speculative(engine_.model(), *g.speculative, engine_.dir());
    } catch (const Error& e) {
      invalid_param("speculative", e.what(), "unsupported_value");
    }
  // A verify keeps per-token states the memory plan counts only where the server speculates.
  if (g.speculative && g.speculative->mtp && !engine_.speculative().mtp && engine_.model().memory_plan().slots > 0)
    invalid_param("speculative",
                  "this server's memory budget was planned without speculation: start it with --speculative auto "
                  "(or mtp) to allow MTP drafts",
                  "unsupported_value");
  return g;
}

HttpResponse HttpServer::chat_completions(const HttpRequest& req) {
  ChatRequest cr = parse_chat_request(parse_body(req.body));
  GenerationRequest g = generation_request(chat_prompt_ids(engine_, cr), cr.options, "messages");
  const bool tools = !cr.tools.is_null();
  return start_job(std::move(g),
                   std::make_shared<OpenAIFormat>(opts_.model_name, true, cr.options.stream, cr.options.include_usage, tools));
}

HttpResponse HttpServer::messages(const HttpRequest& req) {
  ChatRequest cr = parse_messages_request(parse_body(req.body));
  GenerationRequest g = generation_request(chat_prompt_ids(engine_, cr), cr.options, "messages");
  const int prompt_tokens = int(g.prompt.size());
  return start_job(std::move(g), std::make_shared<MessagesFormat>(opts_.model_name, cr.options.stream,
                                                                  !cr.tools.is_null(), prompt_tokens));
}

HttpResponse HttpServer::count_tokens(const HttpRequest& req) {
  const ChatRequest cr = parse_messages_request(parse_body(req.body), /*count_only=*/true);
  return json_response(200, {{"input_tokens", chat_prompt_ids(engine_, cr).size()}});
}

HttpResponse HttpServer::responses(const HttpRequest& req) {
  ChatRequest cr = parse_responses_request(parse_body(req.body));
  // The conversation goes on from a stored response: its turns (not its instructions) first.
  ojson turns = ojson::array();
  if (!cr.previous_response_id.empty()) {
    std::optional<ojson> before = stored_responses_.find(cr.previous_response_id);
    if (!before)
      throw ApiError(400,
                     fmt::format("previous response '{}' is not kept here (the last {} stored responses are, while the "
                                 "server runs)",
                                 cr.previous_response_id.substr(0, 128), StoredResponses::kKept),
                     "invalid_request_error", "previous_response_id", "previous_response_not_found");
    turns = std::move(*before);
  }
  for (const ojson& m : cr.messages)
    if (m["role"] != "system") turns.push_back(m);
  ojson messages = ojson::array();
  for (const ojson& m : cr.messages)
    if (m["role"] == "system") messages.push_back(m);
  for (const ojson& m : turns) messages.push_back(m);
  cr.messages = std::move(messages);
  GenerationRequest g = generation_request(chat_prompt_ids(engine_, cr), cr.options, "input");
  ResponsesFormat::OnDone keep;
  if (cr.store)
    keep = [this, turns = std::move(turns)](const std::string& id, const ojson& answer) mutable {
      turns.push_back(answer);
      stored_responses_.keep(id, std::move(turns));
    };
  return start_job(std::move(g), std::make_shared<ResponsesFormat>(opts_.model_name, cr.options.stream, !cr.tools.is_null(),
                                                                   cr.options.max_tokens, cr.previous_response_id,
                                                                   std::move(keep)));
}

HttpResponse HttpServer::completions(const HttpRequest& req) {
  TextCompletionRequest tr = parse_completion_request(parse_body(req.body), engine_.model().config().vocab);
  std::vector<int> ids = tr.prompt_ids.empty() ? engine_.tokenizer().encode(tr.prompt) : tr.prompt_ids;
  GenerationRequest g = generation_request(std::move(ids), tr.options, "prompt");
  return start_job(std::move(g), std::make_shared<OpenAIFormat>(opts_.model_name, false, tr.options.stream, tr.options.include_usage, false));
}

// A generation's response body as the transport pulls it: the formatter's framing around the
// job's text, a heartbeat while it is quiet; abandoning it cancels the job.
class HttpServer::JobStream : public HttpStream {
 public:
  JobStream(std::shared_ptr<Job> job, std::shared_ptr<Formatter> f, std::atomic<int>& open)
      : job_(std::move(job)), f_(std::move(f)), open_(open) {
    ++open_;
  }
  ~JobStream() override { release(); }

  void start(std::function<void()> wake) override { job_->set_listener(std::move(wake)); }

  std::string pull(bool& done) override {
    std::string out;
    if (!begun_) out = f_->begin(), begun_ = true;
    Job::Update u = job_->take(std::chrono::milliseconds(0));
    if (!u.text.empty()) out += f_->text(u.text);
    if (u.done) {
      out += job_->error().empty() ? f_->end(job_->result()) : f_->error(job_->error());
      done = true;
      release();
    }
    return out;
  }

  std::string heartbeat() override { return f_->heartbeat(); }
  int status() const override { return job_->error().empty() ? 200 : 500; }

  // Whatever ended the response early (client gone, write timeout, server stop): nobody reads on.
  void abandon() override { release(); }

 private:
  void release() {
    if (released_) return;
    released_ = true;
    job_->set_listener(nullptr);
    job_->cancel();
    --open_;
  }

  std::shared_ptr<Job> job_;
  std::shared_ptr<Formatter> f_;
  std::atomic<int>& open_;
  bool begun_ = false, released_ = false;
};

HttpResponse HttpServer::start_job(GenerationRequest g, std::shared_ptr<Formatter> f) {
  auto job = std::make_shared<Job>(std::move(g));
  if (!queue_.submit(job)) {
    if (draining_) throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
    throw ApiError(429, fmt::format("too many requests: {} are already waiting (--queue-limit); retry later", opts_.queue_limit),
                   "rate_limit_error", "", "queue_full");
  }
  HttpResponse r;
  r.content_type = f->content_type();
  r.stream = std::make_shared<JobStream>(std::move(job), std::move(f), open_responses_);
  return r;
}

}  // namespace ms
