#include "server/server.h"

#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <thread>

#include "server/api_error.h"
#include "server/chat_output.h"
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

bool authorized(const HttpRequest& req, const std::string& key) {
  const std::string got = req.header("Authorization");
  const std::string want = "Bearer " + key;
  // Constant time in the key's length: no early exit on the first differing byte.
  unsigned diff = got.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i) diff |= unsigned(uint8_t(want[i]) ^ uint8_t(i < got.size() ? got[i] : 0));
  return diff == 0;
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

// What a response body is made of, as generation goes: OpenAI chat or text completion,
// streamed (SSE) or whole (one JSON object at the end).
class HttpServer::Formatter {
 public:
  Formatter(std::string model, bool chat, bool stream, bool include_usage, bool parse_tools)
      : model_(std::move(model)), chat_(chat), stream_(stream), include_usage_(include_usage), parse_tools_(parse_tools),
        deltas_(parse_tools), id_(random_id(chat ? "chatcmpl-" : "cmpl-")), created_(std::time(nullptr)) {}

  const char* content_type() const { return stream_ ? "text/event-stream" : "application/json"; }

  std::string begin() {
    if (!stream_ || !chat_) return "";
    return sse(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
  }

  std::string text(const std::string& piece) {
    if (!stream_) {
      text_ += piece;
      return "";
    }
    if (!chat_) return sse(text_chunk(piece, nullptr));
    std::string out;
    for (const ojson& d : deltas_.feed(piece)) out += sse(chunk(d, nullptr));
    return out;
  }

  std::string end(const GenerationResult& r) {
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

  // A failure: the whole answer where it comes before the headers went out (the transport then
  // sends 500), else reported in the body after a 200.
  std::string error(const std::string& message) {
    ApiError e(500, "generation failed: " + message, "server_error");
    return stream_ ? sse(e.to_json()) + "data: [DONE]\n\n" : e.to_json().dump();
  }

  // SSE comments are ignored by clients. A whole answer has none: its head goes out with it, so
  // that a client's own timeout and abort work as its documentation says (the transport notices
  // a client that leaves without writing to it).
  std::string heartbeat() const { return stream_ ? ": keep-alive\n\n" : ""; }

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
  bool chat_, stream_, include_usage_, parse_tools_;
  ChatDeltaStream deltas_;
  std::string id_;
  std::time_t created_;
  std::string text_;  // whole responses: everything so far
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
  for (auto it = s.begin(); it != s.end(); ++it) j[it.key()] = it.value();
  return j.dump();
}

void HttpServer::add_routes() {
  HttpTransport& h = *http_;
  // Checked on a request's head, before its body is read.
  h.set_admission([this](const HttpRequest& req) -> std::optional<HttpResponse> {
    if (req.path == "/health") return std::nullopt;
    if (!opts_.api_key.empty() && !authorized(req, opts_.api_key))
      return error_response(ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                     "invalid_request_error", "", "invalid_api_key"));
    if (draining_ && req.method == "POST")
      return error_response(ApiError(503, "the server is shutting down", "server_error", "", "shutting_down"));
    return std::nullopt;
  });
  // The transport's own refusals (unknown path, limits, malformed requests) in OpenAI's form.
  h.set_error_body([](int status, const std::string& message, const std::string& code) {
    const char* type = status >= 500 ? "server_error" : "invalid_request_error";
    return error_response(ApiError(status, message, type, "", code));
  });

  auto guarded = [this](HttpResponse (HttpServer::*handler)(const HttpRequest&)) {
    return [this, handler](const HttpRequest& req) {
      try {
        return (this->*handler)(req);
      } catch (const ApiError& e) {
        if (e.status == 429) stats_.record_rejected();
        return error_response(e);
      }
    };
  };
  using Runs = HttpTransport::Runs;
  h.route("POST", "/v1/chat/completions", guarded(&HttpServer::chat_completions), Runs::OnWorker);
  h.route("POST", "/v1/completions", guarded(&HttpServer::completions), Runs::OnWorker);
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
  h.route("GET", "/metrics", [this](const HttpRequest&) {
    QueueState q{queue_.waiting(), opts_.queue_limit, queue_.busy()};
    return text_response(prometheus_text(stats_.snapshot(), q, http_->counters()), "text/plain; version=0.0.4");
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
                   std::make_shared<Formatter>(opts_.model_name, true, cr.options.stream, cr.options.include_usage, tools));
}

HttpResponse HttpServer::completions(const HttpRequest& req) {
  TextCompletionRequest tr = parse_completion_request(parse_body(req.body), engine_.model().config().vocab);
  std::vector<int> ids = tr.prompt_ids.empty() ? engine_.tokenizer().encode(tr.prompt) : tr.prompt_ids;
  GenerationRequest g = generation_request(std::move(ids), tr.options, "prompt");
  return start_job(std::move(g), std::make_shared<Formatter>(opts_.model_name, false, tr.options.stream, tr.options.include_usage, false));
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
