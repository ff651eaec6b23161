// serve: the OpenAI-compatible HTTP server (docs/serve.md).
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <memory>
#include <pthread.h>
#include <thread>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/model_options.h"
#include "server/server.h"
#include "util/error.h"

namespace ms::cli {

namespace {

// A year, in seconds: longer timeouts are mistakes, and their milliseconds would overflow.
constexpr double kLongestTimeout = 365.0 * 24 * 3600;

// SIGTERM and SIGINT are taken by one thread (blocked everywhere else, before any thread
// starts) which asks the server to stop gracefully.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, ...)");
  auto model = std::make_shared<ModelArgs>();
  auto o = std::make_shared<ServerOptions>();
  add_model_options(cmd, *model, true);
  add_speculative_options(cmd, *model);
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str()->check(non_empty());
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str()->check(int_in(0, 65535));
  // An empty key would be no key: the server would run open while the user thought it guarded.
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on every endpoint but /health")
      ->check(non_empty());
  cmd->add_option("--model-name", o->model_name, "Model id to report (default: the model directory's name)")
      ->check(non_empty());
  cmd->add_option("--queue-limit", o->queue_limit, "Requests that may wait behind the running one; more get 429")
      ->capture_default_str()
      ->check(int_in(1, 4096));
  cmd->add_option("--request-timeout", o->request_timeout_s,
                  "Seconds from arrival until a request is cut off (finish_reason \"timeout\")")
      ->capture_default_str()
      ->check(real_in(0.0, kLongestTimeout, true));
  cmd->add_option("--drain-timeout", o->drain_timeout_s,
                  "On SIGTERM, seconds in-flight requests may take to finish before they are cancelled (0: at once)")
      ->capture_default_str()
      ->check(real_in(0.0, kLongestTimeout));
  cmd->add_option_function<std::string>(
         "--dashboard", [o](const std::string& v) { o->dashboard = v == "on"; },
         "GET /dashboard: a live page of the expert tiers, and /api/dashboard, what it polls (on or off; default on)")
      ->check(CLI::IsMember({"on", "off"}));
  HttpLimits& l = o->http;
  cmd->add_option("--max-body-bytes", l.max_body_bytes, "Largest request body accepted (after de-chunking); larger get 413")
      ->capture_default_str()
      ->check(int_in(1024, int64_t(1) << 30));
  cmd->add_option("--header-timeout", l.header_timeout_s,
                  "Seconds a connection may take to send a request's head (idle keep-alive time included)")
      ->capture_default_str()
      ->check(real_in(0.1, 3600.0));
  cmd->add_option("--body-timeout", l.body_timeout_s, "Seconds a client may take to send a request's body")
      ->capture_default_str()
      ->check(real_in(0.1, 3600.0));
  cmd->add_option("--max-connections", l.max_connections, "Open connections served at once; more get 503")
      ->capture_default_str()
      ->check(int_in(1, 65536));
  cmd->add_option("--max-client-connections", l.max_client_connections,
                  "Open connections from one client address; more get 503")
      ->capture_default_str()
      ->check(int_in(1, 65536));
  cmd->callback([model, o] {
    const sigset_t signals = stop_signals();
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    auto engine = Engine::load(model->model, model_options(*model));
    HttpServer server(*engine, *o);
    const int port = server.bind();
    std::printf("moestream: serving %s on http://%s:%d\n", engine->dir().c_str(), o->host.c_str(), port);
    std::fflush(stdout);
    std::atomic<bool> served{false};
    std::thread stopper;
    std::thread waiter([&] {
      const timespec poll{0, 200 * 1000 * 1000};
      while (!served) {
        if (sigtimedwait(&signals, nullptr, &poll) <= 0) continue;
        if (stopper.joinable()) {  // a second signal: the user will not wait for the drain
          std::fprintf(stderr, "moestream: stopping now\n");
          std::_Exit(1);
        }
        std::fprintf(stderr, "moestream: stopping (finishing in-flight requests; signal again to quit at once)\n");
        stopper = std::thread([&] { server.shutdown(); });
      }
    });
    server.serve();
    served = true;
    waiter.join();
    if (stopper.joinable()) stopper.join();
  });
}

}  // namespace

void register_serve_commands(CLI::App& app) { add_serve(app); }

}  // namespace ms::cli
