#pragma once
// Starting `moestream serve` on a free loopback port for a test, and talking to it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

extern char** environ;

namespace ms::test {

using json = nlohmann::json;

class ServerProcess {
 public:
  // Starts the server with `args` added to `serve --model DIR --port 0`; waits for its
  // "serving ... on http://HOST:PORT" line. port() is 0 when it did not come up.
  ServerProcess(const std::string& model_dir, const std::vector<std::string>& args) {
    int out[2];
    if (pipe(out) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::vector<std::string> argv = {MOESTREAM_BINARY, "serve", "--model", model_dir, "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    // The child must receive SIGTERM even if a test runner blocked it.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    const int rc = posix_spawn(&pid_, MOESTREAM_BINARY, &fa, &attr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(out[1]);
    if (rc != 0) {
      pid_ = -1;
      close(out[0]);
      return;
    }
    std::string line;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < until) {
      pollfd p{out[0], POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[256];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, size_t(n));
    }
    close(out[0]);
    const size_t colon = line.rfind(':');
    if (line.find("serving") != std::string::npos && colon != std::string::npos) port_ = std::atoi(line.c_str() + colon + 1);
  }

  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  // Sends `sig` and waits up to `timeout` for the exit; returns the exit status, or -1 when it
  // did not exit normally in time.
  int signal_and_wait(int sig, std::chrono::seconds timeout) {
    kill(pid_, sig);
    const auto until = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < until) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
};

struct StreamResult {
  int status = 0;
  std::string body;
  bool connected = false;
};

// POSTs `body` and collects the response as it arrives; `on_data` returning false closes the
// connection early.
inline StreamResult post_streaming(const ServerProcess& s, const std::string& path, const std::string& body,
                                   const std::function<bool(const std::string& so_far)>& on_data = {},
                                   const httplib::Headers& headers = {}) {
  httplib::Client c = s.client();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.headers.emplace("Content-Type", "application/json");
  req.body = body;
  StreamResult out;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.body.append(data, n);
    return !on_data || on_data(out.body);
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  c.send(req, res, err);
  out.connected = err == httplib::Error::Success || err == httplib::Error::Canceled;
  out.status = res.status;
  return out;
}

// The JSON payloads of an SSE body (without the final [DONE]); `done` tells whether it was there.
inline std::vector<json> sse_events(const std::string& body, bool* done) {
  std::vector<json> events;
  *done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind(":", 0) == 0) continue;  // comment (keep-alive)
    if (event.rfind("data: ", 0) != 0) throw std::runtime_error("not an SSE data line: " + event);
    std::string data = event.substr(6);
    if (data == "[DONE]") {
      *done = true;
      continue;
    }
    events.push_back(json::parse(data));
  }
  if (pos != body.size()) throw std::runtime_error("SSE body ends inside an event");
  return events;
}

// A TCP connection to the server's loopback port, or -1.
inline int connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  close(fd);
  return -1;
}

// Reads from `fd` until the peer closes it or `timeout` passes; `closed` says which.
inline std::string read_until_closed(int fd, std::chrono::milliseconds timeout, bool* closed = nullptr) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + timeout;
  if (closed) *closed = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, int(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) {
      if (closed) *closed = true;
      return out;
    }
    out.append(buf, size_t(n));
  }
}

// Sends raw bytes on a fresh connection and reads whatever comes back. With `half_close` the
// sending side is shut after the bytes (the server takes that as a client gone once it answers).
inline std::string raw_exchange(int port, const std::string& bytes, bool half_close = true) {
  int fd = connect_loopback(port);
  if (fd < 0) return "";
  (void)!write(fd, bytes.data(), bytes.size());
  if (half_close) shutdown(fd, SHUT_WR);
  std::string out = read_until_closed(fd, std::chrono::milliseconds(2000));
  close(fd);
  return out;
}

}  // namespace ms::test
