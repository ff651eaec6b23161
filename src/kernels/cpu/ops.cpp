#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ms::cpu {

void rmsnorm(const float* x, int rows, int dim, const float* w, float offset, float eps, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * size_t(dim);
    float* o = out + size_t(r) * size_t(dim);
    float ss = 0.f;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (int i = 0; i < dim; ++i) o[i] = xr[i] * inv * (offset + w[i]);
  }
}

void rope(float* x, int T, int heads, int head_dim, int rot_dim, int pos0, double theta) {
  const int half = rot_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(theta, double(2 * i) / double(rot_dim)));
  for (int t = 0; t < T; ++t) {
    const float pos = float(pos0 + t);
    for (int i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[size_t(i)];
      const float c = std::cos(angle), s = std::sin(angle);
      for (int h = 0; h < heads; ++h) {
        float* v = x + (size_t(t) * size_t(heads) + size_t(h)) * size_t(head_dim);
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

float warp_order_sum(const float* v, int n) {
  std::array<float, 32> lane{};
  for (int i = 0; i < n; ++i) lane[size_t(i % 32)] += v[i];
  for (int o = 16; o > 0; o /= 2) {
    std::array<float, 32> next;
    for (int l = 0; l < 32; ++l) next[size_t(l)] = lane[size_t(l)] + lane[size_t(l ^ o)];
    lane = next;
  }
  return lane[0];
}

void softmax(float* x, int rows, int n) {
  for (int r = 0; r < rows; ++r) {
    float* v = x + size_t(r) * size_t(n);
    const float mx = *std::max_element(v, v + n);
    for (int i = 0; i < n; ++i) v[i] = std::exp(v[i] - mx);
    const float sum = warp_order_sum(v, n);
    for (int i = 0; i < n; ++i) v[i] /= sum;
  }
}

void top_k(const float* x, int n, int k, int* idx) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [x](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  std::copy(order.begin(), order.begin() + k, idx);
}

}  // namespace ms::cpu
