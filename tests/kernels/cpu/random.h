#pragma once
// Random inputs of the CPU kernel tests.
#include <cstdint>
#include <random>
#include <vector>

namespace ms::cpu {

// n normal samples of standard deviation scale, the same for a seed.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace ms::cpu
