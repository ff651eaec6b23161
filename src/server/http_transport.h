#pragma once
// HTTP/1.1 for `moestream serve`, on Boost.Beast: one I/O thread multiplexes every connection
// (an idle or slow client costs a socket, not a thread), cheap routes are answered on it, the
// others run on worker threads. Every phase of a request has a deadline and every connection a
// per-client quota, so no client can starve another; bodies are bounded after de-chunking and
// compressed bodies are refused (docs/serve.md).
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ms {

struct HttpLimits {
  size_t max_body_bytes = 4 << 20;   // after de-chunking; larger get 413
  size_t max_header_bytes = 16 << 10;  // request line and fields; larger get 431
  double header_timeout_s = 10;  // from waiting for a request (keep-alive idle time included) to its last header byte
  double body_timeout_s = 60;    // from the header's end to the body's last byte
  double write_timeout_s = 30;   // a response write the client does not read in time ends the connection
  size_t max_connections = 256;
  size_t max_client_connections = 32;  // open connections from one client address
};

// What the transport has seen of its clients, for /api/stats and /metrics.
struct HttpCounters {
  size_t open = 0;       // connections open now
  size_t accepted = 0;   // connections taken
  size_t refused = 0;    // connections refused over --max-connections / --max-client-connections
  size_t timed_out = 0;  // connections closed at a head, body or write deadline
  size_t rejected = 0;   // requests the transport refused itself (malformed, too large, encoded, unknown route)
};

struct HttpRequest {
  std::string method, target, path;  // path: target without the query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string client;  // the peer's address

  // The value of a header (case-insensitive name), or "" when absent.
  std::string header(std::string_view name) const;
};

// A response body that grows while it is written (chunked transfer): the transport pulls what
// is ready whenever the producer wakes it, and writes a heartbeat when nothing came for a while
// (none where the heartbeat is empty: the head then waits for the first bytes of the body). A
// client that leaves is noticed by its socket turning readable at EOF, written to or not.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  // `wake` may be called from any thread, any number of times, when more is ready.
  virtual void start(std::function<void()> wake) = 0;
  // What is ready now (may be empty); `done` once the body is complete.
  virtual std::string pull(bool& done) = 0;
  virtual std::string heartbeat() = 0;
  // The status of a stream that is done before any of it was written (a failure: 500); 200
  // once anything was, whatever happens after.
  virtual int status() const { return 200; }
  // The response ended before done (client gone, write timed out, server stopped).
  virtual void abandon() = 0;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::shared_ptr<HttpStream> stream;  // set: a chunked response whose body comes from it
  bool close = false;                  // close the connection after this response
  std::vector<std::pair<std::string, std::string>> headers;  // more header fields (a whole response's)
};

class HttpTransport {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // A request's head, before its body is read: an answer ends the request there (auth, draining).
  using Admission = std::function<std::optional<HttpResponse>(const HttpRequest&)>;
  // The body of the transport's own refusals (unknown path, limits, malformed requests).
  using ErrorBody = std::function<HttpResponse(int status, const std::string& message, const std::string& code)>;
  enum class Runs { OnIoThread, OnWorker };  // OnIoThread: cheap, never blocks

  HttpTransport(HttpLimits limits, size_t workers);
  ~HttpTransport();

  // `path` is matched exactly, or where it ends in "/*" (e.g. "/v1/models/*") as a prefix
  // followed by at least one more character.
  void route(std::string method, std::string path, Handler h, Runs where);
  void set_admission(Admission a);
  void set_error_body(ErrorBody e);

  // Listens on host:port (0: any free port); returns the port. Throws when binding fails.
  int bind(const std::string& host, int port);
  // Serves until stop().
  void run();
  // From any thread: stops accepting, ends every connection (abandoning streams), run() returns.
  void stop();
  // From any thread.
  HttpCounters counters() const;

 private:
  class Impl;
  friend class Connection;  // http_transport.cpp: one client connection, run by Impl
  std::unique_ptr<Impl> impl_;
};

}  // namespace ms
