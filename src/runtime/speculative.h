#pragma once
// MTP self-speculative decoding. The model's MTP head drafts K tokens; the main model runs the
// token before them and the K drafts in one forward (ForwardOptions::verify), each row with the
// bits a one-token step gives it; the sampler accepts a prefix and the state keeps just that
// (State::keep_steps). Greedy output is the plain decoder's, token for token. Sampled output has
// the sampler's distribution: a draft d drawn from the head's distribution q is kept with
// probability min(1, p(d) / q(d)), else the token is drawn from max(0, p - q) normalised, where
// p is the main model's distribution (both after the sampler's penalties and cuts).
//
// The head's cache follows the main model: its row t takes the main model's hidden state at t
// and the token at t + 1, run for each prompt chunk (prompt_chunk) and, for accepted tokens,
// together with the next draft. K is fixed (--draft K) or chosen before each step (auto) from
// the measured acceptance at each depth and the measured time of a plain step, a verify of each
// size and a draft step, so that speculation runs only where it is expected to pay.
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace ms {

struct SpeculativeStats {
  uint64_t verifies = 0;      // verify forwards
  uint64_t drafted = 0;       // tokens the head proposed
  uint64_t accepted = 0;      // of them, kept
  uint64_t spec_tokens = 0;   // tokens made by verify forwards: the accepted drafts and the one after
  uint64_t plain_steps = 0;   // one-token steps (K = 0)
  int draft = 0;              // K of the last step
  // What the last run measured (moving averages, seconds; 0: not measured): a plain step, a
  // verify of K drafts ([K]), a draft step.
  double plain_s = 0, draft_s = 0;
  std::array<double, kMaxDraft + 1> verify_s{};

  void add(const SpeculativeStats& o);
  double acceptance() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  double mean_accepted() const { return verifies ? double(accepted) / double(verifies) : 0.0; }
  // Tokens per forward of the main model (1 without speculation).
  double tokens_per_forward() const {
    const uint64_t forwards = verifies + plain_steps;
    return forwards ? double(spec_tokens + plain_steps) / double(forwards) : 0.0;
  }
};

// --draft's text: "auto" (kDraftAuto) or 1..kMaxDraft; fails naming the text otherwise.
int parse_draft(const std::string& s);
// "off", "mtp K" or "mtp auto": for --stats and logs.
std::string describe(const SpeculativeOptions& opt);
// opt settled for the model: `automatic` becomes MTP drafts where the model has an MTP head and
// runs where verification does (the CPU, for now), else off. Fails, naming the model directory,
// where opt asks for MTP drafts outright and the model cannot give them.
SpeculativeOptions resolve_speculative(const Model& model, SpeculativeOptions opt, const std::string& dir);

// One row of speculative sampling: the draft d, drawn from q, is kept with probability
// min(1, p(d) / q(d)); else the token is drawn from max(0, p - q) normalised. `uniform` gives
// draws in [0, 1) and is asked only where a draw decides. Returns the token; *kept says which.
int speculative_pick(const cpu::Distribution& p, const cpu::Distribution& q, int d, const std::function<double()>& uniform,
                     bool* kept);
// A draw from d with the uniform u in [0, 1).
int draw(const cpu::Distribution& d, double u);

// What --draft auto measures and decides from, kept across the generations of a session so that
// each does not start cold: the acceptance at each depth (moving averages) and the times of a
// plain step, a verify of each size and a draft step (medians of the last few).
class DraftTuner {
 public:
  DraftTuner();
  // K for the next step, at most `most`: the one with the most expected tokens per expected
  // second, 0 (a plain step) included. While 0 wins, K = 1 is tried now and then, at doubling gaps.
  int choose(int most);
  void plain_step(double s);
  void verify(int K, double s);
  void draft_step(double s);
  void kept(int depth, bool kept);
  // Medians (seconds; 0: not measured).
  double plain_s() const { return plain_.median(); }
  double draft_s() const { return draft_.median(); }
  double verify_s(int K) const { return verify_[size_t(K)].median(); }

 private:
  struct Recent {  // the last few samples of a time
    std::array<double, 9> v{};
    int n = 0, next = 0;
    void add(double x);
    double median() const;
  };
  std::array<double, kMaxDraft + 1> accept_{};  // [depth]: P(the draft at depth is kept | reached)
  std::array<Recent, kMaxDraft + 1> verify_;    // [K]
  Recent plain_, draft_;
  int since_plain_ = 0;  // verifies since the last plain step was timed
  int plain_run_ = 0;    // plain steps since the last verify
  int probe_gap_;        // plain steps before K = 1 is tried again
};

class Speculator {
 public:
  // opt.mtp must hold (resolve_speculative first). tuner: measurements kept from earlier
  // generations (auto); null: this generation's own.
  Speculator(const Model& model, const SpeculativeOptions& opt, DraftTuner* tuner = nullptr);

  // After the forward of prompt tokens ids[0, n), which ended at the state's position and kept
  // its hidden states (ForwardOptions::hidden): runs the MTP rows they complete.
  void prompt_chunk(State& state, const int* ids, int n, const ForwardResult& r);

  // Decoder::run's contract, with speculation.
  int run(State& state, int first, int max_steps, Sampler& sampler, const std::vector<int>& seen, bool routes,
          const OnStep& on_token);

  const SpeculativeStats& stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;

  // MTP rows waiting to run: the main model's hidden states at positions [pending_pos_, ...)
  // and the tokens after them.
  struct Pending {
    int pos = 0;
    std::vector<float> hidden;
    std::vector<int> ids;
    int rows() const { return int(ids.size()); }
  };

  // Runs the pending rows and the row of (the state's last hidden state, x); K drafts picked
  // from the head; their distributions in q. Returns the drafts.
  std::vector<int> draft(State& state, int x, int K, Sampler& sampler, const std::vector<int>& seen,
                         std::vector<cpu::Distribution>& q);
  // Runs the pending rows alone (at the end of a run), so that the head's cache is complete.
  void flush(State& state);
  // Appends MTP row `pos` (hidden state h, next token id) to the pending rows; keeps the newest
  // kMaxPending, leaving a gap in the head's cache before them where it drops some.
  void push_row(int pos, const float* h, int id);

  const Model& model_;
  SpeculativeOptions opt_;
  SpeculativeStats stats_;
  Pending pending_;
  cpu::SampleScratch scratch_;

  DraftTuner own_tuner_;
  DraftTuner* tuner_;
};

}  // namespace ms
