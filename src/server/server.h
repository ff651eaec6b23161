#pragma once
// `moestream serve`: an OpenAI-compatible HTTP server over one Engine (docs/serve.md).
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <mutex>
#include <deque>
#include <string>

#include "runtime/engine.h"
#include "server/openai_request.h"
#include "runtime/session.h"
#include "runtime/stats.h"
#include "server/generation_queue.h"
#include "server/http_transport.h"

namespace ms {

struct QueueState;  // server/metrics.h

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  std::string api_key;  // empty: no authentication
  std::string model_name;  // the id /v1/models lists; default: the model directory's name
  size_t queue_limit = 16;  // requests that may wait behind the running one
  double request_timeout_s = 600;  // from arrival (queueing included) to the end of generation
  double drain_timeout_s = 10;  // on shutdown: how long in-flight requests may take to finish
  HttpLimits http;  // body and head sizes, read deadlines, connections per client
  bool dashboard = true;  // GET /dashboard and /api/dashboard (server/dashboard.h)
};

class HttpServer {
 public:
  HttpServer(const Engine& engine, ServerOptions opts);
  ~HttpServer();

  // Binds the socket; returns the port (useful with port 0). Throws when binding fails.
  int bind();
  // Serves until shutdown(); returns once in-flight responses are done.
  void serve();
  // Graceful stop, callable from any thread: new requests get 503, running and waiting ones
  // get drain_timeout_s to finish and are then cancelled, then the server stops.
  void shutdown();

 private:
  class Formatter;
  class OpenAIFormat;
  class MessagesFormat;
  class ResponsesFormat;
  class JobStream;
  void add_routes();
  HttpResponse chat_completions(const HttpRequest& req);
  HttpResponse completions(const HttpRequest& req);
  HttpResponse messages(const HttpRequest& req);   // Anthropic's Messages API
  HttpResponse count_tokens(const HttpRequest& req);  // ... and its token count of a request
  HttpResponse responses(const HttpRequest& req);  // OpenAI's Responses API
  GenerationRequest generation_request(std::vector<int> prompt, const CompletionOptions& o, const char* prompt_param) const;
  HttpResponse start_job(GenerationRequest g, std::shared_ptr<Formatter> f);
  std::string stats_json() const;
  QueueState queue_state() const;  // for /metrics and /api/dashboard
  nlohmann::ordered_json model_object() const;  // the served model as /v1/models lists it

  // The APIs whose requests /api/stats and /metrics count, and their names there.
  enum class Api : uint8_t { ChatCompletions, Completions, Messages, CountTokens, Responses };
  static constexpr size_t kApis = 5;
  static constexpr const char* kApiNames[kApis] = {"chat_completions", "completions", "messages",
                                                   "messages_count_tokens", "responses"};

  // The Responses API's stored responses: each one's conversation (chat messages, its answer
  // last), the last kKept of them, for previous_response_id.
  class StoredResponses {
   public:
    static constexpr size_t kKept = 256;
    void keep(const std::string& id, nlohmann::ordered_json turns);
    std::optional<nlohmann::ordered_json> find(const std::string& id) const;

   private:
    mutable std::mutex mu_;
    std::deque<std::pair<std::string, nlohmann::ordered_json>> kept_;  // oldest first
  };

  const Engine& engine_;
  ServerOptions opts_;
  StoredResponses stored_responses_;
  std::array<std::atomic<uint64_t>, kApis> api_requests_{};
  EngineStats stats_;
  Session session_;
  GenerationQueue queue_;
  std::atomic<bool> draining_{false};
  std::atomic<int> open_responses_{0};  // streamed responses not yet finished writing
  std::unique_ptr<HttpTransport> http_;  // last: its connections' streams count open_responses_
};

}  // namespace ms
