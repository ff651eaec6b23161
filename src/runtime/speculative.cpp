#include "runtime/speculative.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "util/error.h"

namespace ms {

namespace {

constexpr int kMaxPending = 16;       // MTP rows kept waiting while no drafts run (older ones: a gap)
constexpr double kAverage = 0.1;      // weight of a new acceptance in its moving average
constexpr double kPriorAccept = 0.5;  // acceptance assumed at a depth not yet tried
constexpr int kFirstProbeGap = 16;    // plain steps before K = 1 is tried again, doubling ...
constexpr int kMaxProbeGap = 512;     // ... up to this while K = 0 wins
constexpr int kReplain = 64;          // verifies between timings of a plain step

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A draw from max(0, p - q) normalised: where a draft was rejected. p's candidates hold all of
// its mass; where nothing is left (p == q, where no rejection can happen) p itself.
int draw_residual(const cpu::Distribution& p, const cpu::Distribution& q, double u) {
  cpu::Distribution r;
  double total = 0;
  for (size_t i = 0; i < p.ids.size(); ++i)
    if (const double m = p.probs[i] - q.p(p.ids[i]); m > 0) {
      r.ids.push_back(p.ids[i]);
      r.probs.push_back(m);
      total += m;
    }
  if (total <= 0) return draw(p, u);
  for (double& m : r.probs) m /= total;
  return draw(r, u);
}

// Row i of a verify forward's per-layer routes, as a one-token step's result carries them.
ForwardResult step_result(const ForwardResult& v, int i, int token, int top_k) {
  ForwardResult r;
  r.token = token;
  r.routes.resize(v.routes.size());
  for (size_t l = 0; l < v.routes.size(); ++l)
    if (!v.routes[l].empty())
      r.routes[l].assign(v.routes[l].begin() + ptrdiff_t(i) * top_k, v.routes[l].begin() + ptrdiff_t(i + 1) * top_k);
  return r;
}

}  // namespace

// The candidate where the cumulative mass passes u.
int draw(const cpu::Distribution& d, double u) {
  for (size_t i = 0; i < d.ids.size(); ++i)
    if ((u -= d.probs[i]) < 0) return d.ids[i];
  return d.ids.back();
}

int speculative_pick(const cpu::Distribution& p, const cpu::Distribution& q, int d, const std::function<double()>& uniform,
                     bool* kept) {
  const double pd = p.p(d), qd = q.p(d);
  *kept = pd >= qd || uniform() * qd < pd;
  if (*kept) return d;
  return draw_residual(p, q, p.ids.size() == 1 ? 0.0 : uniform());
}

void SpeculativeStats::add(const SpeculativeStats& o) {
  verifies += o.verifies;
  drafted += o.drafted;
  accepted += o.accepted;
  spec_tokens += o.spec_tokens;
  plain_steps += o.plain_steps;
  draft = o.draft;
  if (o.plain_s > 0) plain_s = o.plain_s;
  if (o.draft_s > 0) draft_s = o.draft_s;
  for (size_t k = 0; k < verify_s.size(); ++k)
    if (o.verify_s[k] > 0) verify_s[k] = o.verify_s[k];
}

int parse_draft(const std::string& s) {
  if (s == "auto") return kDraftAuto;
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 1 || v > kMaxDraft)
    fail("draft '{}' is neither auto nor a number of drafts from 1 to {}", s, kMaxDraft);
  return v;
}

std::string describe(const SpeculativeOptions& opt) {
  if (opt.automatic) return opt.draft == kDraftAuto ? "auto" : fmt::format("auto {}", opt.draft);
  if (!opt.mtp) return "off";
  return opt.draft == kDraftAuto ? "mtp auto" : fmt::format("mtp {}", opt.draft);
}

SpeculativeOptions resolve_speculative(const Model& model, SpeculativeOptions opt, const std::string& dir) {
  if (opt.automatic) {
    opt.automatic = false;
    opt.mtp = model.has_mtp() && model.device() == Device::Cpu;
  }
  if (!opt.mtp) return opt;
  if (!model.has_mtp())
    fail("{}: --speculative mtp needs an MTP head (mtp.* tensors), and this model has none (mlx-lm and llama.cpp "
         "drop it: convert an MLX checkpoint with --mtp-from HF_DIR to keep it)",
         dir);
  if (model.device() != Device::Cpu)
    fail("--speculative mtp does not run on the GPU yet: use --speculative off with --device cuda");
  if (opt.draft != kDraftAuto && (opt.draft < 1 || opt.draft > kMaxDraft))
    fail("--draft must be 1 to {} or auto, is {}", kMaxDraft, opt.draft);
  return opt;
}

void DraftTuner::Recent::add(double x) {
  v[size_t(next)] = x;
  next = (next + 1) % int(v.size());
  n = std::min(n + 1, int(v.size()));
}

double DraftTuner::Recent::median() const {
  if (n == 0) return 0;
  std::array<double, 9> s = v;
  std::nth_element(s.begin(), s.begin() + n / 2, s.begin() + n);
  return s[size_t(n / 2)];
}

DraftTuner::DraftTuner() : probe_gap_(kFirstProbeGap) { accept_.fill(kPriorAccept); }

void DraftTuner::plain_step(double s) {
  plain_.add(s);
  since_plain_ = 0;
  ++plain_run_;
}

void DraftTuner::verify(int K, double s) {
  verify_[size_t(K)].add(s);
  ++since_plain_;
  plain_run_ = 0;
}

void DraftTuner::draft_step(double s) { draft_.add(s); }

void DraftTuner::kept(int depth, bool kept) { accept_[size_t(depth)] += kAverage * ((kept ? 1.0 : 0.0) - accept_[size_t(depth)]); }

int DraftTuner::choose(int most) {
  if (most <= 0) return 0;
  const double plain = plain_s();
  if (plain == 0 || since_plain_ >= kReplain) return 0;  // time a plain step first, and now and then
  // Expected tokens per step with K drafts over its expected time, for every K; K = 0 is a plain step.
  int best = 0, measured = 0;
  double best_rate = 1.0 / plain, reach = 1.0, tokens = 1.0;
  for (int k = 1; k <= kMaxDraft; ++k)
    if (verify_s(k) > 0) measured = k;
  for (int k = 1; k <= std::min(most, kMaxDraft); ++k) {
    reach *= accept_[size_t(k)];
    tokens += reach;
    // An unmeasured verify: the nearest measured one scaled by its tokens, or a plain step per token.
    double v = verify_s(k);
    if (v == 0) v = measured ? verify_s(measured) * (k + 1) / (measured + 1) : plain * (k + 1);
    if (const double rate = tokens / (v + k * draft_s()); rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  if (best > 0) {
    probe_gap_ = kFirstProbeGap;
    return best;
  }
  if (plain_run_ < probe_gap_) return 0;
  probe_gap_ = std::min(2 * probe_gap_, kMaxProbeGap);  // K = 0 wins: try one draft to see whether it still does
  return 1;
}

Speculator::Speculator(const Model& model, const SpeculativeOptions& opt, DraftTuner* tuner)
    : model_(model), opt_(opt), tuner_(tuner ? tuner : &own_tuner_) {}

void Speculator::push_row(int pos, const float* h, int id) {
  const size_t H = size_t(model_.config().hidden);
  if (pending_.rows() > 0 && pending_.pos + pending_.rows() != pos) pending_ = {};  // not contiguous: start again
  if (pending_.rows() == 0) pending_.pos = pos;
  if (pending_.rows() == kMaxPending) {
    pending_.hidden.erase(pending_.hidden.begin(), pending_.hidden.begin() + ptrdiff_t(H));
    pending_.ids.erase(pending_.ids.begin());
    ++pending_.pos;
  }
  pending_.hidden.insert(pending_.hidden.end(), h, h + H);
  pending_.ids.push_back(id);
}

void Speculator::prompt_chunk(State& state, const int* ids, int n, const ForwardResult& r) {
  const int H = model_.config().hidden;
  const int p0 = state.position() - n;
  if (n <= 0 || r.hidden_pre_norm.size() != size_t(n) * size_t(H)) fail("prompt_chunk needs the chunk's hidden states");
  flush(state);
  // Row t takes the hidden state at t and the token at t + 1: rows [p0 - 1, p0 + n - 1), the
  // first where the state knew the hidden state before this chunk.
  const bool before = p0 > 0 && state.knows_hidden_at(p0 - 1);
  std::vector<float> hidden;
  if (before) hidden = state.last_hidden;
  hidden.insert(hidden.end(), r.hidden_pre_norm.begin(), r.hidden_pre_norm.end() - H);
  const std::vector<int> next(ids + (before ? 0 : 1), ids + n);
  if (!next.empty()) {
    model_.mtp_forward(hidden.data(), next.data(), int(next.size()), before ? p0 - 1 : p0, state, nullptr, 0);
    state.mtp_rows = p0 + n - 1;
  }
  state.set_last_hidden(r.hidden_pre_norm.data() + size_t(n - 1) * size_t(H), H);
}

void Speculator::flush(State& state) {
  if (pending_.rows() == 0) return;
  model_.mtp_forward(pending_.hidden.data(), pending_.ids.data(), pending_.rows(), pending_.pos, state, nullptr, 0);
  state.mtp_rows = pending_.pos + pending_.rows();
  pending_ = {};
}

std::vector<int> Speculator::draft(State& state, int x, int K, Sampler& sampler, const std::vector<int>& seen,
                                   std::vector<cpu::Distribution>& q) {
  const int H = model_.config().hidden, vocab = model_.config().vocab;
  const int P = state.position();
  push_row(P - 1, state.last_hidden.data(), x);
  std::vector<int> drafts;
  std::vector<int> seen_ahead = seen;  // the penalties of each draft see the drafts before it
  q.assign(size_t(K), {});
  std::vector<float> h;
  const auto t0 = Clock::now();
  std::vector<float> logits = model_.mtp_forward(pending_.hidden.data(), pending_.ids.data(), pending_.rows(),
                                                 pending_.pos, state, &h, 1);
  state.mtp_rows = P;
  const size_t last = size_t(pending_.rows() - 1);
  pending_ = {};
  const float* row = logits.data();
  const float* hrow = h.data() + last * size_t(H);
  for (int i = 0; i < K; ++i) {
    if (i > 0) {  // the head again, on its own hidden state and guess, one position on
      std::vector<float> hin(hrow, hrow + H);
      logits = model_.mtp_forward(hin.data(), &drafts.back(), 1, P - 1 + i, state, &h);
      row = logits.data();
      hrow = h.data();
    }
    cpu::distribution(row, vocab, sampler.inputs(seen_ahead, vocab), scratch_, q[size_t(i)]);
    const cpu::Distribution& d = q[size_t(i)];
    drafts.push_back(d.ids.size() == 1 ? d.ids[0] : draw(d, sampler.uniform()));
    seen_ahead.push_back(drafts.back());
  }
  tuner_->draft_step(seconds(t0) / K);
  return drafts;
}

int Speculator::run(State& state, int first, int max_steps, Sampler& sampler, const std::vector<int>& seen,
                    bool routes, const OnStep& on_token) {
  const ModelConfig& cfg = model_.config();
  const int H = cfg.hidden, vocab = cfg.vocab;
  int steps = 0, x = first;
  std::vector<cpu::Distribution> q;
  cpu::Distribution p;
  while (steps < max_steps) {
    const int P = state.position();
    const bool can_draft = state.knows_last_hidden();
    const int most = max_steps - steps - 1;
    const int K = !can_draft ? 0 : opt_.draft == kDraftAuto ? tuner_->choose(most) : std::min(opt_.draft, most);
    stats_.draft = K;
    if (K == 0) {  // a plain step, its hidden state kept for the head's next row
      const float* h_prev = can_draft ? state.last_hidden.data() : nullptr;
      if (h_prev) push_row(P - 1, h_prev, x);
      ForwardOptions fo{.hidden = true, .routes = routes};
      fo.pick = [&] { return sampler.next(seen, vocab); };
      const auto t0 = Clock::now();
      ForwardResult r = model_.forward(&x, 1, state, fo);
      if (can_draft) tuner_->plain_step(seconds(t0));
      ++stats_.plain_steps;
      state.set_last_hidden(r.hidden_pre_norm.data(), H);
      ++steps;
      x = r.token;
      if (!on_token(r)) break;
      continue;
    }
    std::vector<int> ids = {x};
    const std::vector<int> drafts = draft(state, x, K, sampler, seen, q);
    ids.insert(ids.end(), drafts.begin(), drafts.end());
    const auto t0 = Clock::now();
    const ForwardResult v = model_.forward(ids.data(), K + 1, state,
                                           {.all_logits = true, .hidden = true, .routes = routes, .verify = true});
    tuner_->verify(K, seconds(t0));
    ++stats_.verifies;
    stats_.drafted += uint64_t(K);
    // Each row's token in turn: a draft kept, or the pick that ends the step.
    int made = 0;
    bool stop = false;
    for (int i = 0; i <= K; ++i) {
      cpu::distribution(v.logits.data() + size_t(i) * size_t(vocab), vocab, sampler.inputs(seen, vocab), scratch_, p);
      int token;
      bool kept = false;
      if (i < K) {
        token = speculative_pick(p, q[size_t(i)], drafts[size_t(i)], [&] { return sampler.uniform(); }, &kept);
        tuner_->kept(i + 1, kept);
      } else {
        token = p.ids.size() == 1 ? p.ids[0] : draw(p, sampler.uniform());
      }
      stats_.accepted += kept;
      ++made;
      x = token;
      if (!on_token(step_result(v, i, token, cfg.top_k))) {
        stop = true;
        break;
      }
      if (!kept) break;
    }
    stats_.spec_tokens += uint64_t(made);
    // ids[0, made) stay processed (every token on_token got but the last); the head's rows for
    // them but the last wait for the next draft.
    state.keep_steps(made);
    for (int i = 0; i + 1 < made; ++i) push_row(P + i, v.hidden_pre_norm.data() + size_t(i) * size_t(H), ids[size_t(i) + 1]);
    state.set_last_hidden(v.hidden_pre_norm.data() + size_t(made - 1) * size_t(H), H);
    steps += made;
    if (stop) break;
  }
  flush(state);
  stats_.plain_s = tuner_->plain_s();
  stats_.draft_s = tuner_->draft_s();
  for (int k = 1; k <= kMaxDraft; ++k) stats_.verify_s[size_t(k)] = tuner_->verify_s(k);
  return steps;
}

}  // namespace ms
