// The HTTP layer under hostile and careless clients, against a real `moestream serve`: idle and
// header-dripping connections, slow bodies, the per-client quota, chunked and compressed bodies,
// ambiguous framing, and /health answering within a second throughout.
#include <fmt/format.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "server_fixture.h"

namespace ms::test {
namespace {

using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;

const char* kModel = "models/pycoder-moe";
constexpr int kClientQuota = 40;

class HttpLayerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string dir = shared_path(kModel);
    if (!dir.empty())
      server_ = new ServerProcess(dir, {"--max-body-bytes", "65536", "--header-timeout", "1.5", "--body-timeout", "1.5",
                                        "--max-client-connections", std::to_string(kClientQuota)});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    MS_REQUIRE_SHARED(kModel, dir);
    ASSERT_GT(server_->port(), 0) << "the server did not start";
  }

  // GET /health on a fresh connection: its status, and how long the answer took.
  static std::pair<int, Ms> health() {
    const auto t0 = std::chrono::steady_clock::now();
    httplib::Client c("127.0.0.1", server_->port());
    c.set_connection_timeout(5, 0);
    c.set_read_timeout(5, 0);
    auto r = c.Get("/health");
    return {r ? r->status : 0, std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - t0)};
  }

  static void expect_healthy_within_a_second() {
    auto [status, took] = health();
    EXPECT_EQ(status, 200);
    EXPECT_LT(took.count(), 1000) << "/health took " << took.count() << " ms";
  }

  // The transport's counters as /api/stats reports them.
  static json http_counters() {
    auto r = server_->client().Get("/api/stats");
    return r ? json::parse(r->body)["http"] : json();
  }

  static size_t server_rss() {
    std::ifstream in("/proc/" + std::to_string(server_->pid()) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("VmRSS:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;
    return 0;
  }

  static ServerProcess* server_;
};
ServerProcess* HttpLayerTest::server_ = nullptr;

std::string status_line(const std::string& response) { return response.substr(0, response.find("\r\n")); }

// More idle connections than the old server had threads (24): /health still answers at once,
// and the idle sockets are closed at the header timeout.
TEST_F(HttpLayerTest, IdleConnectionsDoNotStarveHealth) {
  std::vector<int> idle;
  for (int i = 0; i < kClientQuota - 4; ++i) idle.push_back(connect_loopback(server_->port()));
  for (int fd : idle) ASSERT_GE(fd, 0);
  for (int i = 0; i < 5; ++i) {
    expect_healthy_within_a_second();
    std::this_thread::sleep_for(200ms);
  }
  for (int fd : idle) {
    bool closed = false;
    read_until_closed(fd, 3000ms, &closed);
    EXPECT_TRUE(closed) << "an idle connection outlived the header timeout";
    close(fd);
  }
  expect_healthy_within_a_second();
}

// A head sent a byte at a time (slowloris) is cut off at the header timeout, however steadily the
// bytes come; /health answers meanwhile.
TEST_F(HttpLayerTest, DrippedHeadIsCutOffAtTheHeaderTimeout) {
  const int timed_out_before = http_counters()["timed_out"];
  std::vector<int> drips;
  for (int i = 0; i < 30; ++i) drips.push_back(connect_loopback(server_->port()));
  const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  for (int fd : drips) (void)!write(fd, head.data(), head.size());
  const auto start = std::chrono::steady_clock::now();
  std::vector<bool> open(drips.size(), true);
  size_t still_open = drips.size();
  while (still_open > 0 && std::chrono::steady_clock::now() - start < 4s) {
    for (size_t i = 0; i < drips.size(); ++i) {
      if (!open[i]) continue;
      if (write(drips[i], "a", 1) != 1) open[i] = false, --still_open;
      pollfd p{drips[i], POLLIN, 0};
      if (open[i] && poll(&p, 1, 0) > 0) {
        char b;
        if (read(drips[i], &b, 1) <= 0) open[i] = false, --still_open;
      }
    }
    expect_healthy_within_a_second();
    std::this_thread::sleep_for(100ms);
  }
  const auto took = std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(still_open, 0u) << "dripping connections were still open after " << took << " ms";
  EXPECT_LT(took, 3500);
  for (int fd : drips) close(fd);
  EXPECT_GE(http_counters()["timed_out"].get<int>(), timed_out_before + 30);
}

// A body slower than the body timeout is dropped; the next client is served.
TEST_F(HttpLayerTest, SlowBodyIsCutOffAtTheBodyTimeout) {
  int fd = connect_loopback(server_->port());
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"";
  ASSERT_EQ(write(fd, head.data(), head.size()), ssize_t(head.size()));
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - start < 4s) {
    (void)!write(fd, "aa", 2);
    read_until_closed(fd, 200ms, &closed);
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - start).count(), 3000);
  close(fd);
  expect_healthy_within_a_second();
}

// One client may hold at most --max-client-connections; the next gets a 503 and is closed, and
// the quota is free again once its connections close.
TEST_F(HttpLayerTest, ConnectionsPerClientAreCapped) {
  const int refused_before = http_counters()["refused"];
  std::vector<int> held;
  for (int i = 0; i < kClientQuota; ++i) held.push_back(connect_loopback(server_->port()));
  std::this_thread::sleep_for(200ms);  // let the server accept them all
  int over = connect_loopback(server_->port());
  ASSERT_GE(over, 0);
  bool closed = false;
  const std::string answer = read_until_closed(over, 3000ms, &closed);
  EXPECT_EQ(status_line(answer), "HTTP/1.1 503 Service Unavailable") << answer;
  EXPECT_NE(answer.find("too_many_connections"), std::string::npos) << answer;
  EXPECT_TRUE(closed);
  close(over);
  for (int fd : held) close(fd);
  std::this_thread::sleep_for(300ms);
  expect_healthy_within_a_second();
  const json after = http_counters();
  EXPECT_EQ(after["refused"].get<int>(), refused_before + 1);
  EXPECT_LE(after["open"].get<int>(), 2) << "closed connections are still counted";
  const std::string metrics = server_->client().Get("/metrics")->body;
  EXPECT_NE(metrics.find("moestream_http_connections_refused_total " + std::to_string(refused_before + 1)), std::string::npos)
      << metrics.substr(0, 2000);
}

// Chunked bodies: within the limit they are served; over it they are refused as soon as the
// decoded size passes it, and what the client keeps sending is dropped, not buffered.
TEST_F(HttpLayerTest, ChunkedBodiesAreBoundedAfterDechunking) {
  httplib::Client c = server_->client();
  const std::string ok = R"({"prompt": "def add(a, b):", "max_tokens": 2})";
  auto small = c.Post(
      "/v1/completions",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset < ok.size()) sink.write(ok.data() + offset, std::min<size_t>(7, ok.size() - offset));
        else sink.done();
        return true;
      },
      "application/json");
  ASSERT_TRUE(small);
  EXPECT_EQ(small->status, 200) << small->body;

  const size_t rss_before = server_rss();
  const std::string piece(1 << 20, ' ');
  size_t sent = 0;
  auto big = c.Post(
      "/v1/completions",
      [&](size_t, httplib::DataSink& sink) {
        if (sent >= (size_t(100) << 20)) sink.done();
        else if (!sink.write(piece.data(), piece.size())) return false;
        sent += piece.size();
        return true;
      },
      "application/json");
  if (big) {  // the client may also see the connection close first
    EXPECT_EQ(big->status, 413) << big->body;
  }
  EXPECT_LT(server_rss(), rss_before + (size_t(32) << 20));

  // The raw form: a chunk header announcing more than the limit.
  const std::string raw = raw_exchange(server_->port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                                        "fffffff\r\n" + std::string(70000, 'a'));
  EXPECT_EQ(status_line(raw), "HTTP/1.1 413 Payload Too Large") << raw.substr(0, 200);
  expect_healthy_within_a_second();
}

// Compressed bodies are refused (a 99 KiB gzip body once decoded to 100 MiB): 415, whatever the
// encoding and its spelling.
TEST_F(HttpLayerTest, CompressedBodiesAreRefused) {
  const int rejected_before = http_counters()["rejected"];
  httplib::Client c = server_->client();
  c.set_compress(true);  // httplib's client gzips the body and says so
  auto r = c.Post("/v1/completions", std::string(R"({"prompt": "def f():", "max_tokens": 2})") + std::string(20000, ' '),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 415) << r->body;
  EXPECT_NE(r->body.find("unsupported_media_type"), std::string::npos) << r->body;
  for (const char* enc : {"gzip", "deflate", "br", "GZIP", "x-gzip", "gzip, identity", "compress"}) {
    const std::string body = R"({"prompt": "x", "max_tokens": 1})";
    const std::string out = raw_exchange(server_->port(), fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: {}\r\n"
                                                                      "Content-Length: {}\r\n\r\n{}",
                                                                      enc, body.size(), body));
    EXPECT_EQ(status_line(out), "HTTP/1.1 415 Unsupported Media Type") << enc << ": " << out.substr(0, 200);
  }
  EXPECT_EQ(http_counters()["rejected"].get<int>(), rejected_before + 8);
  // Identity is no encoding.
  auto plain = httplib::Client("127.0.0.1", server_->port())
                   .Post("/v1/completions", {{"Content-Encoding", "identity"}}, R"({"prompt": "x", "max_tokens": 1})",
                         "application/json");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 200) << plain->body;
}

// Framing a proxy and this server could read differently (request smuggling) is refused, and the
// connection closed, so that nothing after it is taken as a request.
TEST_F(HttpLayerTest, AmbiguousFramingIsRefusedAndTheConnectionClosed) {
  const std::string smuggled = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::vector<std::string> heads = {
      "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
      "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
      "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
      "Content-Length: 5\r\nContent-Length: 6\r\n",
      "Content-Length: -5\r\n",
      "Content-Length: 5x\r\n",
      "Transfer-Encoding: gzip\r\n",
      "Transfer-Encoding: chunked, gzip\r\n",
  };
  for (const std::string& h : heads) {
    int fd = connect_loopback(server_->port());
    ASSERT_GE(fd, 0);
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + h + "\r\n0\r\n\r\n" + smuggled;
    (void)!write(fd, req.data(), req.size());
    bool closed = false;
    const std::string out = read_until_closed(fd, 3000ms, &closed);
    close(fd);
    EXPECT_EQ(status_line(out), "HTTP/1.1 400 Bad Request") << h << out.substr(0, 300);
    EXPECT_TRUE(closed) << h;
    EXPECT_EQ(out.find("\"object\":\"list\""), std::string::npos) << "the smuggled request was answered: " << h;
  }
  expect_healthy_within_a_second();
}

// /health answers within a second while the generation worker is busy with a long answer. The
// answer is endless and streamed; the client hangs up once the checks are done, so the test does
// not depend on how fast the model decodes.
TEST_F(HttpLayerTest, HealthAnswersWhileTheWorkerIsBusy) {
  std::atomic<bool> streaming{false}, done_checking{false}, ended{false};
  std::thread busy([&] {
    post_streaming(*server_, "/v1/completions",
                   R"({"prompt": "def main():", "max_tokens": 100000, "ignore_eos": true, "stream": true})",
                   [&](const std::string&) {
                     streaming = true;
                     return !done_checking;
                   });
    ended = true;
  });
  for (int i = 0; i < 500 && !streaming && !ended; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(streaming) << "the generation did not start";
  int checks = 0;
  for (; checks < 5 && !ended; ++checks) {
    expect_healthy_within_a_second();
    std::this_thread::sleep_for(100ms);
  }
  const bool still_generating = !ended;
  done_checking = true;
  busy.join();
  EXPECT_TRUE(still_generating) << "the generation ended after " << checks << " checks";
  EXPECT_EQ(checks, 5);
}

// A client that asks before sending its body (Expect: 100-continue) is told to go on; HTTP/1.0
// clients get a streamed answer without chunked framing, ended by closing the connection.
TEST_F(HttpLayerTest, ExpectContinueAndHttp10AreServed) {
  int fd = connect_loopback(server_->port());
  const std::string body = R"({"prompt": "def f():", "max_tokens": 2})";
  const std::string head = fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
                                       body.size());
  (void)!write(fd, head.data(), head.size());
  const std::string interim = read_until_closed(fd, 1000ms);
  EXPECT_EQ(status_line(interim), "HTTP/1.1 100 Continue") << interim;
  (void)!write(fd, body.data(), body.size());
  const std::string out = read_until_closed(fd, 3000ms);
  close(fd);
  EXPECT_EQ(status_line(out), "HTTP/1.1 200 OK") << out.substr(0, 300);

  // "stream": 1 is not a boolean: the answer is a named 400, over HTTP/1.0.
  const std::string bad = R"({"prompt": "def f():", "max_tokens": 2, "stream": 1})";
  const std::string streamed =
      raw_exchange(server_->port(), fmt::format("POST /v1/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{}", bad.size(), bad));
  EXPECT_EQ(status_line(streamed), "HTTP/1.0 400 Bad Request") << streamed.substr(0, 300);
  const std::string sbody = R"({"prompt": "def f():", "max_tokens": 2, "stream": true})";
  const std::string ok = raw_exchange(
      server_->port(), fmt::format("POST /v1/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{}", sbody.size(), sbody), false);
  EXPECT_EQ(status_line(ok), "HTTP/1.0 200 OK") << ok.substr(0, 300);
  EXPECT_EQ(ok.find("Transfer-Encoding"), std::string::npos) << ok.substr(0, 300);
  EXPECT_NE(ok.find("data: [DONE]"), std::string::npos) << ok;
}

// Heads larger than the limit get 431; unknown paths 404 and known paths with the wrong method
// 405, in OpenAI's error form.
TEST_F(HttpLayerTest, OversizedHeadsAndWrongRoutesAreNamed) {
  const std::string big = raw_exchange(server_->port(), "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(40000, 'b') + "\r\n\r\n");
  EXPECT_EQ(status_line(big), "HTTP/1.1 431 Request Header Fields Too Large") << big.substr(0, 200);
  httplib::Client c = server_->client();
  auto missing = c.Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_NE(missing->body.find("not_found"), std::string::npos);
  auto wrong = c.Get("/v1/chat/completions");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 405);
  EXPECT_NE(wrong->body.find("method_not_allowed"), std::string::npos);
}

// A request line in absolute form (RFC 9112 3.2.2: a server must accept it) reaches the route
// its path names; a query is not part of the path.
TEST_F(HttpLayerTest, AbsoluteFormTargetsAreRouted) {
  for (const char* target : {"http://127.0.0.1/health", "HTTP://localhost:8080/health?x=1", "/health?x=1"}) {
    const std::string out = raw_exchange(server_->port(), fmt::format("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", target));
    EXPECT_EQ(status_line(out), "HTTP/1.1 200 OK") << target << ": " << out.substr(0, 300);
  }
  const std::string models = raw_exchange(server_->port(), "GET http://127.0.0.1:9/v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_line(models), "HTTP/1.1 200 OK") << models.substr(0, 300);
  const std::string root = raw_exchange(server_->port(), "GET http://127.0.0.1 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(status_line(root).substr(0, 12), status_line(raw_exchange(server_->port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n")).substr(0, 12));
}

}  // namespace
}  // namespace ms::test
