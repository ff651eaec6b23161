#pragma once
// Where a layer's VRAM misses run when the GPU is short of VRAM (the hybrid GPU + CPU decode, and
// its prompt chunks): each routed expert that is not in VRAM is either copied there over PCIe and
// computed by the GPU, or computed by the CPU cores from the host tier while the GPU works. A
// layer's GPU side takes the longer of its resident experts' compute and the copies, then the
// copied experts' compute; its CPU side, the round trip of the layer's input and partial sums,
// then its experts' compute.
// place_misses balances the two sides from rates measured at start and kept current
// (RateEstimate), so that neither waits for the other longer than it must.
#include <cstdint>
#include <string>
#include <vector>

namespace ms {

// `--cpu-experts`: auto (each miss placed by cost), off (every miss copied), or N (the experts
// of the first N MoE layers always on the CPU, as llama.cpp's --n-cpu-moe).
struct CpuExperts {
  enum class Mode { Auto, Off, Layers } mode = Mode::Auto;
  int layers = 0;  // Mode::Layers
  // Whether MoE layer `moe_index` (0-based among the MoE layers) computes every expert on the CPU.
  bool static_cpu(int moe_index) const { return mode == Mode::Layers && moe_index < layers; }
};
// "auto", "off" or a count N >= 0 ("0" is off); fails naming the text.
CpuExperts parse_cpu_experts(const std::string& s);
std::string describe(const CpuExperts& c);

// What a placement costs, in seconds or bytes per second; a zero rate stands for a side that is
// absent (no CPU side: every miss copied).
struct PlacementRates {
  double h2d_bytes_per_s = 0;   // the copy stream's rate into VRAM
  double gpu_expert_s = 0;      // one routed expert's compute on the GPU, its record in VRAM
  double cpu_expert_s = 0;      // the same on the CPU from the host tier, at the run's threads
  double cpu_round_trip_s = 0;  // the layer's input to the host and the CPU's partial sums back
  // A prompt chunk's expert on the CPU: each token after the first (the weights are read once);
  // an expert serving u tokens takes cpu_expert_s + (u − 1)·cpu_token_s.
  double cpu_token_s = 0;
};

// A layer's misses as the store sees them when its routing is known.
struct LayerMisses {
  std::vector<int> experts;   // routed, not in VRAM: those most worth keeping in VRAM first
  int resident = 0;           // routed experts already in VRAM
  size_t record_bytes = 0;    // of one expert
  double copy_backlog_s = 0;  // copies queued on the copy stream before these (prefetch)
  // A prompt chunk's: the tokens each miss serves (empty: one each, a decode token's), and the
  // bytes of one token's row, which goes to the host and comes back for each of a CPU expert's
  // tokens over the copy link (a decode token's single row is in cpu_round_trip_s).
  std::vector<int> users;
  size_t row_bytes = 0;
  // The CPU's time for miss i (of experts).
  double cpu_expert_s(size_t i, const PlacementRates& r) const;
};

struct Placement {
  std::vector<int> copy, cpu;   // experts copied into VRAM; experts the CPU computes
  double gpu_s = 0, cpu_s = 0;  // each side's expected time for the layer
  double expected_s() const { return gpu_s > cpu_s ? gpu_s : cpu_s; }
};

// The side each miss runs on: the first misses (most worth keeping; in a prompt chunk, those
// serving the most tokens) copied, the rest computed by the CPU, split where the slower side is
// fastest; where two splits tie, the one copying more (a copy also serves later tokens). Without
// a CPU side every miss is copied.
Placement place_misses(const LayerMisses& m, const PlacementRates& r);

// Each side's expected time for a given split (place_misses' model).
Placement cost_of(const LayerMisses& m, const PlacementRates& r, int n_cpu);

// Where a layer's routed experts ran, over some decode steps and prompt chunks: computed on the
// GPU from VRAM (hits), copied into VRAM then computed there, or computed by the CPU; and each
// side's time (the waits are decode steps').
struct PlacementStats {
  uint64_t gpu = 0, copied = 0, cpu = 0;
  double cpu_busy_s = 0;  // the CPU computing experts
  double cpu_wait_s = 0;  // the host idle until the GPU reached the layer's routing
  double gpu_wait_s = 0;  // the GPU idle until the CPU's sums arrived
  PlacementStats& operator+=(const PlacementStats& o) {
    gpu += o.gpu, copied += o.copied, cpu += o.cpu, cpu_busy_s += o.cpu_busy_s, cpu_wait_s += o.cpu_wait_s;
    gpu_wait_s += o.gpu_wait_s;
    return *this;
  }
};

// A rate kept current from measurements: an exponential moving average (weight `alpha` on each
// new sample) that starts from the value measured at start. Samples that are not positive finite
// numbers (a timer that read nothing) are ignored.
class RateEstimate {
 public:
  explicit RateEstimate(double start = 0, double alpha = 0.2) : value_(start), alpha_(alpha) {}
  void add(double sample);
  double value() const { return value_; }
  long samples() const { return samples_; }

 private:
  double value_, alpha_;
  long samples_ = 0;
};

}  // namespace ms
