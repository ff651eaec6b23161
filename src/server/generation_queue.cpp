#include "server/generation_queue.h"

#include <exception>

namespace ms {

Job::Job(GenerationRequest req) : req_(std::move(req)) { req_.cancel = &cancelled_; }

Job::Update Job::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return done_ || !text_.empty(); });
  Update u;
  u.text.swap(text_);
  u.done = done_;
  return u;
}

void Job::set_listener(std::function<void()> listener) {
  std::lock_guard lock(listener_mu_);
  listener_ = std::move(listener);
}

void Job::notify() {
  cv_.notify_all();
  // Called under its own lock, so that once set_listener(nullptr) returns no call is under way.
  std::lock_guard lock(listener_mu_);
  if (listener_) listener_();
}

bool Job::on_text(const std::string& piece) {
  {
    std::lock_guard lock(mu_);
    text_ += piece;
  }
  notify();
  return !cancelled_;
}

void Job::finish(GenerationResult r, std::string error) {
  {
    std::lock_guard lock(mu_);
    result_ = std::move(r);
    error_ = std::move(error);
    done_ = true;
  }
  notify();
}

GenerationQueue::GenerationQueue(Session& session, EngineStats& stats, size_t limit)
    : session_(session), stats_(stats), limit_(limit), worker_([this] { run(); }) {}

GenerationQueue::~GenerationQueue() {
  {
    std::lock_guard lock(mu_);
    closed_ = stopping_ = true;
  }
  cancel_all();
  cv_.notify_all();
  worker_.join();
}

bool GenerationQueue::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mu_);
    if (closed_ || waiting_.size() >= limit_) return false;
    waiting_.push_back(std::move(job));
  }
  cv_.notify_all();
  return true;
}

void GenerationQueue::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
}

bool GenerationQueue::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [&] { return waiting_.empty() && !running_; });
}

void GenerationQueue::cancel_all() {
  std::lock_guard lock(mu_);
  for (auto& j : waiting_) j->cancel();
  if (running_) running_->cancel();
}

size_t GenerationQueue::waiting() const {
  std::lock_guard lock(mu_);
  return waiting_.size();
}

bool GenerationQueue::busy() const {
  std::lock_guard lock(mu_);
  return running_ != nullptr;
}

void GenerationQueue::run() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
      if (waiting_.empty()) return;  // stopping with nothing left
      job = running_ = waiting_.front();
      waiting_.pop_front();
    }
    GenerationResult r;
    std::string error;
    try {
      r = session_.generate(job->request(), [&](const std::string& piece) { return job->on_text(piece); });
    } catch (const std::exception& e) {
      // The cache may be half-updated: start the next request from scratch.
      session_.reset();
      error = e.what();
      r.finish_reason = "error";
    }
    stats_.record_request({r.prompt_tokens, r.reused_tokens, int(r.tokens.size()), r.prefill_tok_s, r.decode_tok_s,
                           r.time_to_first_token_s, r.finish_reason});
    job->finish(std::move(r), std::move(error));
    {
      std::lock_guard lock(mu_);
      running_.reset();
    }
    idle_cv_.notify_all();
  }
}

}  // namespace ms
