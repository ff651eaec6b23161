#pragma once
// Requests run in turn on one generation thread that owns the Session (and so the
// conversation cache); HTTP threads hand in Jobs and read their text as it is made.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/session.h"

namespace ms {

class Job {
 public:
  explicit Job(GenerationRequest req);

  GenerationRequest& request() { return req_; }
  // Asks the generation to stop (client gone, server stopping); harmless when already done.
  void cancel() { cancelled_ = true; }

  struct Update {
    std::string text;  // made since the previous take()
    bool done = false;
  };
  // Waits up to `timeout` for new text or the end.
  Update take(std::chrono::milliseconds timeout);
  // Called on the generation thread whenever text or the end arrives; it must not block.
  // Once set_listener(nullptr) has returned, the old listener is not running and never will.
  void set_listener(std::function<void()> listener);
  // Valid once take() said done.
  const GenerationResult& result() const { return result_; }
  const std::string& error() const { return error_; }  // non-empty when generation threw

  // Generation side.
  bool on_text(const std::string& piece);
  void finish(GenerationResult r, std::string error = "");

 private:
  void notify();

  GenerationRequest req_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  bool done_ = false;
  std::mutex listener_mu_;  // guards listener_ and its calls
  std::function<void()> listener_;
  GenerationResult result_;
  std::string error_;
};

class GenerationQueue {
 public:
  // `limit`: most requests waiting (not counting the one running).
  GenerationQueue(Session& session, EngineStats& stats, size_t limit);
  ~GenerationQueue();

  // False when the queue is full or closed.
  bool submit(std::shared_ptr<Job> job);
  // No new jobs; running and waiting ones continue.
  void close();
  // Waits until no job is waiting or running, at most `timeout`; true when idle.
  bool wait_idle(std::chrono::milliseconds timeout);
  // Cancels the running and waiting jobs.
  void cancel_all();

  size_t waiting() const;
  bool busy() const;

 private:
  void run();

  Session& session_;
  EngineStats& stats_;
  const size_t limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // work arrives or stopping
  std::condition_variable idle_cv_;  // a job finished
  std::deque<std::shared_ptr<Job>> waiting_;
  std::shared_ptr<Job> running_;
  bool closed_ = false, stopping_ = false;
  std::thread worker_;
};

}  // namespace ms
