#include "experts/placement.h"

#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "util/error.h"

namespace ms {

CpuExperts parse_cpu_experts(const std::string& s) {
  if (s == "auto") return {};
  if (s == "off") return {.mode = CpuExperts::Mode::Off};
  int n = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || n < 0)
    fail("--cpu-experts '{}': expected auto, off or a number of MoE layers (0 or more)", s);
  if (n == 0) return {.mode = CpuExperts::Mode::Off};
  return {.mode = CpuExperts::Mode::Layers, .layers = n};
}

std::string describe(const CpuExperts& c) {
  switch (c.mode) {
    case CpuExperts::Mode::Auto: return "auto (each VRAM miss copied or computed by the CPU, by measured cost)";
    case CpuExperts::Mode::Off: return "off (every VRAM miss copied)";
    case CpuExperts::Mode::Layers: return fmt::format("the first {} MoE layers' experts on the CPU", c.layers);
  }
  return "";
}

double LayerMisses::cpu_expert_s(size_t i, const PlacementRates& r) const {
  const int u = users.empty() ? 1 : users[i];
  const double io = r.h2d_bytes_per_s > 0 ? double(u) * double(row_bytes) / r.h2d_bytes_per_s : 0;
  return r.cpu_expert_s + double(u - 1) * r.cpu_token_s + io;
}

Placement cost_of(const LayerMisses& m, const PlacementRates& r, int n_cpu) {
  const int n = int(m.experts.size());
  const int n_copy = n - n_cpu;
  Placement p;
  // The layer's copies start behind those queued before them; the resident experts compute while
  // they land, and each copied expert once it has.
  const double copies_s =
      n_copy > 0 && r.h2d_bytes_per_s > 0 ? m.copy_backlog_s + double(n_copy) * double(m.record_bytes) / r.h2d_bytes_per_s : 0;
  p.gpu_s = std::max(double(m.resident) * r.gpu_expert_s, copies_s) + double(n_copy) * r.gpu_expert_s;
  p.cpu_s = n_cpu > 0 ? r.cpu_round_trip_s : 0;
  for (int i = n_copy; i < n; ++i) p.cpu_s += m.cpu_expert_s(size_t(i), r);
  p.copy.assign(m.experts.begin(), m.experts.begin() + n_copy);
  p.cpu.assign(m.experts.begin() + n_copy, m.experts.end());
  return p;
}

Placement place_misses(const LayerMisses& m, const PlacementRates& r) {
  const int n = int(m.experts.size());
  const bool cpu_side = r.cpu_expert_s > 0;
  Placement best = cost_of(m, r, 0);
  if (!cpu_side) return best;
  for (int n_cpu = 1; n_cpu <= n; ++n_cpu) {
    Placement p = cost_of(m, r, n_cpu);
    if (p.expected_s() < best.expected_s()) best = std::move(p);  // strictly: ties keep the copies
  }
  return best;
}

void RateEstimate::add(double sample) {
  if (!(sample > 0) || !std::isfinite(sample)) return;
  value_ = samples_ == 0 && value_ <= 0 ? sample : (1 - alpha_) * value_ + alpha_ * sample;
  ++samples_;
}

}  // namespace ms
