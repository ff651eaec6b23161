#include "server/http_transport.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>

#include "util/error.h"

namespace ms {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// The path of a request target (RFC 9112 3.2): origin-form "/p?q" gives "/p"; absolute-form
// "http://host:port/p?q", which a server must accept, gives "/p" ("/" where it has none).
std::string origin_path(const std::string& target) {
  std::string path = target.substr(0, target.find('?'));
  for (const char* scheme : {"http://", "https://"}) {
    const size_t n = std::strlen(scheme);
    if (path.size() < n || !beast::iequals(path.substr(0, n), scheme)) continue;
    const size_t slash = path.find('/', n);
    return slash == std::string::npos ? "/" : path.substr(slash);
  }
  return path;
}

// A streamed response that wrote nothing for this long writes a heartbeat.
constexpr auto kHeartbeat = std::chrono::milliseconds(1000);
// How long a closing connection reads (and drops) what the client still sends, so that the
// response is not lost to a reset; and how long a refused connection may take to read its 503.
constexpr auto kLinger = std::chrono::milliseconds(1000);
constexpr auto kRefusalWrite = std::chrono::milliseconds(2000);
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

// A route's path is matched exactly, or where it ends in "/*" as a prefix with something after it.
bool route_matches(const std::string& route, const std::string& path) {
  if (route.size() < 2 || route.compare(route.size() - 2, 2, "/*") != 0) return route == path;
  const size_t n = route.size() - 1;  // the prefix, with its slash
  return path.size() > n && path.compare(0, n, route, 0, n) == 0;
}

std::string chunk_frame(const std::string& data) { return fmt::format("{:x}\r\n", data.size()) + data + "\r\n"; }

HttpResponse plain_error(int status, const std::string& message, const std::string&) {
  HttpResponse r;
  r.status = status;
  r.content_type = "text/plain";
  r.body = message + "\n";
  return r;
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (auto& [k, v] : headers)
    if (beast::iequals(k, beast::string_view(name.data(), name.size()))) return v;
  return "";
}

struct Route {
  std::string method, path;
  HttpTransport::Handler handler;
  HttpTransport::Runs where;
};

class Connection;

class HttpTransport::Impl {
 public:
  Impl(HttpLimits limits, size_t workers) : limits_(limits), workers_(std::max<size_t>(1, workers)), acceptor_(ioc_), retry_(ioc_) {}

  ~Impl() {
    workers_.stop();
    workers_.join();
  }

  const Route* find(const std::string& method, const std::string& path, bool* path_known) const {
    *path_known = false;
    for (auto& r : routes_) {
      if (!route_matches(r.path, path)) continue;
      *path_known = true;
      if (r.method == method) return &r;
    }
    return nullptr;
  }

  HttpResponse error(int status, const std::string& message, const std::string& code) const {
    return error_body_ ? error_body_(status, message, code) : plain_error(status, message, code);
  }

  int bind(const std::string& host, int port);
  void accept();
  void stop();
  void forget(Connection* c, const std::string& client);

  HttpLimits limits_;
  std::vector<Route> routes_;
  Admission admission_;
  ErrorBody error_body_;
  net::io_context ioc_{1};
  net::thread_pool workers_;
  tcp::acceptor acceptor_;
  net::steady_timer retry_;
  // Touched on the I/O thread only.
  std::unordered_map<Connection*, std::weak_ptr<Connection>> live_;
  std::map<std::string, size_t> per_client_;
  std::atomic<bool> stopped_{false};
  std::atomic<size_t> open_{0}, accepted_{0}, refused_{0}, timed_out_{0}, rejected_{0};
};

// One client connection: requests are read and answered one at a time (HTTP/1.1 keep-alive),
// every step on the I/O thread except the handlers that run on a worker.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpTransport::Impl& srv, tcp::socket socket, std::string client)
      : srv_(srv), stream_(std::move(socket)), wake_(srv.ioc_), client_(std::move(client)) {}

  void start() { read_head(); }

  // Answers `r` without reading a request (too many connections), then closes.
  void refuse(HttpResponse r) {
    http::response<http::string_body> res{http::status(r.status), 11};
    fill(res, r, false);
    res.body() = std::move(r.body);
    res.prepare_payload();
    whole_ = std::move(res);
    stream_.expires_after(kRefusalWrite);
    http::async_write(stream_, *whole_, [self = shared_from_this()](beast::error_code, size_t) { self->close(); });
  }

  // Ends the connection at once (server stop, fatal error); idempotent.
  void close() {
    if (closed_) return;
    closed_ = true;
    if (body_stream_) body_stream_->abandon(), body_stream_.reset();
    wake_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    srv_.forget(this, client_);
  }

 private:
  void read_head() {
    parser_.emplace();
    parser_->header_limit(uint32_t(srv_.limits_.max_header_bytes));
    parser_->body_limit(srv_.limits_.max_body_bytes);
    stream_.expires_after(seconds(srv_.limits_.header_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_head(ec); });
  }

  void on_head(beast::error_code ec) {
    if (closed_) return;
    if (ec) return refuse_read(ec, true);
    const auto& h = parser_->get();
    req_ = HttpRequest{};
    req_.method = std::string(h.method_string());
    req_.target = std::string(h.target());
    req_.path = origin_path(req_.target);
    req_.client = client_;
    for (const auto& f : h) req_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    version_ = h.version();
    keep_alive_ = h.keep_alive();
    body_pending_ = !parser_->is_done();
    if (auto refusal = check_head()) return answer(std::move(*refusal));
    if (body_pending_ && beast::iequals(trimmed(req_.header("Expect")), "100-continue")) {
      out_ = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(seconds(srv_.limits_.write_timeout_s));
      net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  // What the transport refuses on sight of a head: encodings it does not decode, framing it
  // does not take, unknown routes, and whatever the server's admission check refuses.
  std::optional<HttpResponse> check_head() {
    std::optional<HttpResponse> refusal = transport_refusal();
    if (refusal) ++srv_.rejected_;
    else if (srv_.admission_) refusal = srv_.admission_(req_);
    return refusal;
  }

  std::optional<HttpResponse> transport_refusal() {
    const std::string encoding = trimmed(req_.header("Content-Encoding"));
    if (!encoding.empty() && !beast::iequals(encoding, "identity"))
      return srv_.error(415, fmt::format("Content-Encoding '{}' is not accepted: send the body uncompressed", encoding.substr(0, 64)),
                        "unsupported_media_type");
    const std::string transfer = trimmed(req_.header("Transfer-Encoding"));
    if (!transfer.empty() && !parser_->chunked())
      return srv_.error(400, fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", transfer.substr(0, 64)),
                        "bad_request");
    bool path_known = false;
    route_ = srv_.find(req_.method, req_.path, &path_known);
    if (!route_) {
      if (path_known)
        return srv_.error(405, fmt::format("method {} is not allowed for {}", req_.method.substr(0, 16), req_.path.substr(0, 256)),
                          "method_not_allowed");
      return srv_.error(404, fmt::format("no such endpoint: {} {}", req_.method.substr(0, 16), req_.path.substr(0, 256)), "not_found");
    }
    return std::nullopt;
  }

  void read_body() {
    stream_.expires_after(seconds(srv_.limits_.body_timeout_s));
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (self->closed_) return;
      if (ec) return self->refuse_read(ec, false);
      self->body_pending_ = false;
      self->req_.body = std::move(self->parser_->get().body());
      self->dispatch();
    });
  }

  // A read that failed: a closed or timed-out connection just ends; a malformed or oversized
  // request is answered (the connection closes after, its framing being unknown).
  void refuse_read(beast::error_code ec, bool in_head) {
    if (ec == beast::error::timeout) ++srv_.timed_out_;
    else if (ec != http::error::end_of_stream && ec != net::error::eof) ++srv_.rejected_;
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == net::error::eof ||
        ec == beast::error::timeout || ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == net::error::broken_pipe)
      return close();
    body_pending_ = true;
    if (ec == http::error::body_limit)
      return answer(srv_.error(413, fmt::format("the request body is larger than the server accepts (--max-body-bytes {})",
                                                srv_.limits_.max_body_bytes),
                               "payload_too_large"));
    if (ec == http::error::header_limit)
      return answer(srv_.error(431, fmt::format("the request head is larger than {} bytes", srv_.limits_.max_header_bytes),
                               "header_too_large"));
    std::string why = ec.message();
    if (ec == http::error::bad_transfer_encoding)
      why += " (a request may carry Transfer-Encoding once, and not beside Content-Length)";
    if (ec == http::error::bad_content_length) why += " (not a number, two different values, or beside Transfer-Encoding)";
    answer(srv_.error(400, fmt::format("malformed HTTP request{}: {}", in_head ? "" : " body", why), "bad_request"));
  }

  void dispatch() {
    stream_.expires_never();  // nothing is read or written until the handler answers
    const HttpTransport::Handler& h = route_->handler;
    if (route_->where == HttpTransport::Runs::OnIoThread) return answer(call(h, req_));
    net::post(srv_.workers_, [self = shared_from_this(), h] {
      HttpResponse r = self->call(h, self->req_);
      net::post(self->srv_.ioc_, [self, r = std::move(r)]() mutable {
        if (self->closed_) {
          if (r.stream) r.stream->abandon();
          return;
        }
        self->answer(std::move(r));
      });
    });
  }

  HttpResponse call(const HttpTransport::Handler& h, const HttpRequest& req) const {
    try {
      return h(req);
    } catch (const std::exception& e) {
      return srv_.error(500, std::string("internal error: ") + e.what(), "");
    }
  }

  template <class Res>
  void fill(Res& res, const HttpResponse& r, bool keep) const {
    res.set(http::field::content_type, r.content_type);
    res.set(http::field::server, "moestream");
    for (const auto& [name, value] : r.headers) res.set(name, value);
    res.keep_alive(keep);
  }

  // Writes `r`; a response to a request whose body was not read closes the connection.
  void answer(HttpResponse r) {
    const bool keep = keep_alive_ && !r.close && !body_pending_ && !srv_.stopped_;
    if (r.stream) return begin_stream(std::move(r), keep);
    http::response<http::string_body> res{http::status(r.status), version_ >= 10 ? version_ : 11};
    fill(res, r, keep);
    res.body() = std::move(r.body);
    res.prepare_payload();
    whole_ = std::move(res);
    stream_.expires_after(seconds(srv_.limits_.write_timeout_s));
    http::async_write(stream_, *whole_, [self = shared_from_this(), keep](beast::error_code ec, size_t) {
      self->whole_.reset();
      if (ec) return self->fail_write(ec);
      self->next(keep);
    });
  }

  void fail_write(beast::error_code ec) {
    if (ec == beast::error::timeout) ++srv_.timed_out_;
    close();
  }

  void next(bool keep) {
    if (closed_) return;
    if (keep) return read_head();
    linger_close();
  }

  // Half-closes, then drops what the client still sends until it closes too (or kLinger).
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(kLinger);
    drain_ = std::make_shared<std::array<char, 4096>>();
    drain();
  }

  void drain() {
    stream_.async_read_some(net::buffer(*drain_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->drain();
    });
  }

  // The head goes out with the stream's first bytes (or its first heartbeat): a stream that ends
  // before then, failed, is answered with the status it reports instead of 200. A whole answer
  // (no heartbeat) thus gets the status of how it ended.
  void begin_stream(HttpResponse r, bool keep) {
    body_stream_ = r.stream;
    chunked_ = version_ >= 11;
    keep_stream_ = keep && chunked_;
    stream_type_ = r.content_type;
    head_sent_ = false;
    last_write_ = Clock::now();
    std::weak_ptr<Connection> weak = shared_from_this();
    net::io_context& ioc = srv_.ioc_;
    body_stream_->start([weak, &ioc] {
      net::post(ioc, [weak] {
        if (auto self = weak.lock()) self->wake_.cancel();
      });
    });
    pump();
    watch_peer();
  }

  std::string stream_head(int status) const {
    return fmt::format("HTTP/1.{} {} {}\r\nServer: moestream\r\nContent-Type: {}\r\nCache-Control: no-cache\r\n{}{}\r\n",
                       chunked_ ? 1 : 0, status, std::string(http::obsolete_reason(http::status(status))), stream_type_,
                       chunked_ ? "Transfer-Encoding: chunked\r\n" : "", keep_stream_ ? "" : "Connection: close\r\n");
  }

  // While a response streams nothing is read, so a client that leaves would only be noticed by
  // a failing write: wait for the socket to turn readable, and end the response at once on EOF.
  // Bytes that arrive instead (a pipelined request) stay for the next read.
  void watch_peer() {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || !self->body_stream_) return;
      char byte;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return self->close();
      if (n < 0) self->watch_peer();
    });
  }

  // Writes what the stream has, or its heartbeat when it has been quiet; else waits for a wake.
  void pump() {
    if (closed_ || writing_ || !body_stream_) return;
    bool done = false;
    std::string data = body_stream_->pull(done);
    if (data.empty() && !done) {
      const auto quiet = Clock::now() - last_write_;
      if (quiet >= kHeartbeat) data = body_stream_->heartbeat();
      if (data.empty()) {  // not quiet for long enough, or a body with no heartbeat
        stream_.expires_never();
        wake_.expires_after(quiet < kHeartbeat ? kHeartbeat - quiet : kHeartbeat);
        wake_.async_wait([self = shared_from_this()](beast::error_code) { self->pump(); });
        return;
      }
    }
    std::string out = chunked_ && !data.empty() ? chunk_frame(data) : data;
    if (done && chunked_) out += "0\r\n\r\n";
    if (!head_sent_) out = stream_head(done ? body_stream_->status() : 200) + out, head_sent_ = true;
    write_piece(std::move(out), done);
  }

  void write_piece(std::string out, bool last) {
    writing_ = true;
    out_ = std::move(out);
    stream_.expires_after(seconds(srv_.limits_.write_timeout_s));
    net::async_write(stream_, net::buffer(out_), [self = shared_from_this(), last](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->fail_write(ec);
      self->last_write_ = Clock::now();
      if (!last) return self->pump();
      self->body_stream_.reset();
      self->next(self->keep_stream_);
    });
  }

  HttpTransport::Impl& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> whole_;
  HttpRequest req_;
  const Route* route_ = nullptr;
  unsigned version_ = 11;
  bool keep_alive_ = false, body_pending_ = false, closed_ = false;
  // A streamed response.
  std::shared_ptr<HttpStream> body_stream_;
  net::steady_timer wake_;
  bool chunked_ = true, keep_stream_ = false, writing_ = false, head_sent_ = true;
  std::string stream_type_;  // the streamed response's content type, for its head
  Clock::time_point last_write_ = Clock::now();
  std::string out_;  // the bytes being written
  std::shared_ptr<std::array<char, 4096>> drain_;
  std::string client_;
};

int HttpTransport::Impl::bind(const std::string& host, int port) {
  beast::error_code ec;
  tcp::resolver resolver(ioc_);
  auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) fail("serve: cannot listen on {}:{}: {}", host, port, ec.message());
  for (const auto& e : endpoints) {
    acceptor_.close(ec);
    acceptor_.open(e.endpoint().protocol(), ec);
    if (ec) continue;
    // SO_REUSEADDR allows a quick restart; without SO_REUSEPORT a taken port is an error.
    acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    acceptor_.bind(e.endpoint(), ec);
    if (ec) continue;
    acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (!ec) return acceptor_.local_endpoint().port();
  }
  fail("serve: cannot listen on {}:{} (address in use, or not an address of this machine?)", host, port);
}

void HttpTransport::Impl::accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor_.is_open()) return;
    if (ec) {  // e.g. out of file descriptors: try again shortly rather than spin
      retry_.expires_after(kAcceptRetry);
      retry_.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    const auto peer = socket.remote_endpoint(ignored);
    std::string client = ignored ? "?" : peer.address().to_string();
    auto conn = std::make_shared<Connection>(*this, std::move(socket), client);
    size_t& mine = per_client_[client];
    if (live_.size() >= limits_.max_connections || mine >= limits_.max_client_connections) {
      if (mine == 0) per_client_.erase(client);
      ++refused_;
      conn->refuse(error(503,
                         live_.size() >= limits_.max_connections
                             ? "too many open connections; retry later"
                             : fmt::format("too many open connections from {} (at most {}); retry later", client,
                                           limits_.max_client_connections),
                         "too_many_connections"));
    } else {
      ++mine;
      ++accepted_;
      live_.emplace(conn.get(), conn);
      open_ = live_.size();
      conn->start();
    }
    accept();
  });
}

void HttpTransport::Impl::forget(Connection* c, const std::string& client) {
  if (live_.erase(c) == 0) return;  // a refused connection was never counted
  open_ = live_.size();
  auto it = per_client_.find(client);
  if (it != per_client_.end() && --it->second == 0) per_client_.erase(it);
}

void HttpTransport::Impl::stop() {
  if (stopped_.exchange(true)) return;
  net::post(ioc_, [this] {
    beast::error_code ec;
    acceptor_.close(ec);
    retry_.cancel();
    std::vector<std::shared_ptr<Connection>> open;
    for (auto& [p, w] : live_)
      if (auto c = w.lock()) open.push_back(std::move(c));
    for (auto& c : open) c->close();
    ioc_.stop();
  });
}

HttpTransport::HttpTransport(HttpLimits limits, size_t workers) : impl_(std::make_unique<Impl>(limits, workers)) {}
HttpTransport::~HttpTransport() = default;

void HttpTransport::route(std::string method, std::string path, Handler h, Runs where) {
  impl_->routes_.push_back({std::move(method), std::move(path), std::move(h), where});
}
void HttpTransport::set_admission(Admission a) { impl_->admission_ = std::move(a); }
void HttpTransport::set_error_body(ErrorBody e) { impl_->error_body_ = std::move(e); }
int HttpTransport::bind(const std::string& host, int port) { return impl_->bind(host, port); }

void HttpTransport::run() {
  if (impl_->stopped_) return;
  impl_->accept();
  impl_->ioc_.run();
}

void HttpTransport::stop() { impl_->stop(); }

HttpCounters HttpTransport::counters() const {
  const Impl& i = *impl_;
  return {i.open_.load(), i.accepted_.load(), i.refused_.load(), i.timed_out_.load(), i.rejected_.load()};
}

}  // namespace ms
