#include "server/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <sys/socket.h>

#include <chrono>
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

constexpr auto kPoll = std::chrono::milliseconds(200);
// A waiting response writes a keep-alive this often, so that a client that left is noticed
// (a write to a closed connection fails) and its generation cancelled.
constexpr auto kHeartbeat = std::chrono::milliseconds(1000);

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

void send_json(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.to_json()); }

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

bool authorized(const httplib::Request& req, const std::string& key) {
  const std::string got = req.get_header_value("Authorization");
  const std::string want = "Bearer " + key;
  // Constant time in the key's length: no early exit on the first differing byte.
  unsigned diff = got.size() != want.size();
  for (size_t i = 0; i < want.size(); ++i) diff |= unsigned(uint8_t(want[i]) ^ uint8_t(i < got.size() ? got[i] : 0));
  return diff == 0;
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

  // After the headers went out as 200, a failure can only be reported in the body.
  std::string error(const std::string& message) {
    ApiError e(500, "generation failed: " + message, "server_error");
    return stream_ ? sse(e.to_json()) + "data: [DONE]\n\n" : e.to_json().dump();
  }

  // SSE comments are ignored by clients; JSON allows leading whitespace.
  std::string heartbeat() const { return stream_ ? ": keep-alive\n\n" : " "; }

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
      http_(std::make_unique<httplib::Server>()) {
  if (opts_.model_name.empty()) opts_.model_name = basename_of(engine.dir());
  // Every request holds an HTTP thread while it waits: enough of them that a full queue is
  // answered with 429 rather than left hanging in the accept backlog.
  const size_t threads = opts_.queue_limit + 8;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib's default sets SO_REUSEPORT, with which a second server on a taken port starts and
  // silently shares it; SO_REUSEADDR alone still allows a quick restart.
  http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http_->set_payload_max_length(opts_.max_body_bytes);
  http_->set_keep_alive_timeout(5);
  add_routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = opts_.port == 0 ? http_->bind_to_any_port(opts_.host) : (http_->bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
  if (port <= 0) fail("serve: cannot listen on {}:{} (address in use, or not an address of this machine?)", opts_.host, opts_.port);
  return port;
}

void HttpServer::serve() { http_->listen_after_bind(); }

void HttpServer::shutdown() {
  if (draining_.exchange(true)) return;
  queue_.close();
  const auto drain = std::chrono::milliseconds(int64_t(opts_.drain_timeout_s * 1000));
  if (!queue_.wait_idle(drain)) {
    queue_.cancel_all();
    queue_.wait_idle(std::chrono::hours(1));
  }
  // Let the HTTP threads write what the finished generations made before the sockets close.
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (open_responses_ > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  http_->stop();
}

std::string HttpServer::stats_json() const {
  ojson j = {{"model", opts_.model_name}};
  ojson s = to_json(stats_.snapshot());
  j["queue"] = {{"waiting", queue_.waiting()}, {"running", queue_.busy() ? 1 : 0}, {"limit", opts_.queue_limit}};
  for (auto it = s.begin(); it != s.end(); ++it) j[it.key()] = it.value();
  return j.dump();
}

void HttpServer::add_routes() {
  httplib::Server& h = *http_;
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (!opts_.api_key.empty() && !authorized(req, opts_.api_key)) {
      send_error(res, ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "invalid_request_error", "",
                               "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (draining_ && req.method == "POST") {
      send_error(res, ApiError(503, "the server is shutting down", "server_error", "", "shutting_down"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib's own refusals (unknown path, body over the limit, bad request line) get bodies
  // in OpenAI's form too.
  h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = fmt::format("HTTP {} for {} {}", res.status, req.method, req.path);
    std::string code;
    if (res.status == 404) message = fmt::format("no such endpoint: {} {}", req.method, req.path), code = "not_found";
    if (res.status == 413) message = "the request body is larger than the server accepts (--max-body-bytes)", code = "payload_too_large";
    send_error(res, ApiError(res.status, message, "invalid_request_error", "", code));
  });
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "internal error: " + what, "server_error"));
  });

  auto guarded = [this](void (HttpServer::*handler)(const httplib::Request&, httplib::Response&)) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        (this->*handler)(req, res);
      } catch (const ApiError& e) {
        if (e.status == 429) stats_.record_rejected();
        send_error(res, e);
      }
    };
  };
  h.Post("/v1/chat/completions", guarded(&HttpServer::chat_completions));
  h.Post("/v1/completions", guarded(&HttpServer::completions));
  h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    ojson model = {{"id", opts_.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "moestream"},
                   {"max_model_len", engine_.model().config().max_positions}};
    send_json(res, 200, {{"object", "list"}, {"data", ojson::array({model})}});
  });
  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) send_json(res, 503, {{"status", "stopping"}});
    else send_json(res, 200, {{"status", "ok"}});
  });
  h.Get("/api/stats", [this](const httplib::Request&, httplib::Response& res) { res.set_content(stats_json(), "application/json"); });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    QueueState q{queue_.waiting(), opts_.queue_limit, queue_.busy()};
    res.set_content(prometheus_text(stats_.snapshot(), q), "text/plain; version=0.0.4");
  });
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
  g.deadline = Clock::now() + std::chrono::milliseconds(int64_t(opts_.request_timeout_s * 1000));
  try {
    g.sampling.validate();
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "invalid_request_error");
  }
  return g;
}

void HttpServer::chat_completions(const httplib::Request& req, httplib::Response& res) {
  ChatRequest cr = parse_chat_request(parse_body(req.body));
  const ChatTemplate* tmpl = engine_.chat_template();
  if (!tmpl) throw ApiError(400, "this model has no chat template: use /v1/completions", "invalid_request_error");
  std::string prompt;
  try {
    prompt = tmpl->render(cr.messages, cr.tools, true, cr.template_kwargs);
  } catch (const std::exception& e) {
    throw ApiError(400, fmt::format("the chat template cannot render these messages: {}", e.what()), "invalid_request_error",
                   "messages");
  }
  GenerationRequest g = generation_request(engine_.tokenizer().encode(prompt), cr.options, "messages");
  const bool tools = !cr.tools.is_null();
  start_job(res, std::move(g),
            std::make_shared<Formatter>(opts_.model_name, true, cr.options.stream, cr.options.include_usage, tools));
}

void HttpServer::completions(const httplib::Request& req, httplib::Response& res) {
  TextCompletionRequest tr = parse_completion_request(parse_body(req.body), engine_.model().config().vocab);
  std::vector<int> ids = tr.prompt_ids.empty() ? engine_.tokenizer().encode(tr.prompt) : tr.prompt_ids;
  GenerationRequest g = generation_request(std::move(ids), tr.options, "prompt");
  start_job(res, std::move(g), std::make_shared<Formatter>(opts_.model_name, false, tr.options.stream, tr.options.include_usage, false));
}

void HttpServer::start_job(httplib::Response& res, GenerationRequest g, std::shared_ptr<Formatter> f) {
  auto job = std::make_shared<Job>(std::move(g));
  if (!queue_.submit(job)) {
    if (draining_) throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
    throw ApiError(429, fmt::format("too many requests: {} are already waiting (--queue-limit); retry later", opts_.queue_limit),
                   "rate_limit_error", "", "queue_full");
  }
  ++open_responses_;
  struct Progress {
    bool begun = false;
    Clock::time_point last_write = Clock::now();
  };
  auto progress = std::make_shared<Progress>();
  res.set_chunked_content_provider(
      f->content_type(),
      [job, f, progress](size_t, httplib::DataSink& sink) {
        std::string out;
        if (!progress->begun) out = f->begin(), progress->begun = true;
        Job::Update u = job->take(kPoll);
        if (!u.text.empty()) out += f->text(u.text);
        if (u.done) out += job->error().empty() ? f->end(job->result()) : f->error(job->error());
        if (out.empty() && Clock::now() - progress->last_write >= kHeartbeat) out = f->heartbeat();
        if (!out.empty()) {
          if (!sink.write(out.data(), out.size())) {
            job->cancel();
            return false;
          }
          progress->last_write = Clock::now();
        }
        if (u.done) sink.done();
        return true;
      },
      [this, job](bool) {
        // Whatever ended the response (done, write failure, server stop), nobody reads on.
        job->cancel();
        --open_responses_;
      });
}

}  // namespace ms
