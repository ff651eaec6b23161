#pragma once
// One gated delta rule call's inputs for the kernel tests (CPU and CUDA), distributed as in a
// Qwen3-Next layer: unit q and k (q scaled by 1/sqrt(dk)); g = -exp(A_log) * softplus(a + dt_bias)
// with exp(A_log) up to 16, a few nearly closed gates (g down to -200); beta = sigmoid(b); the
// state zero or random.
#include <cmath>
#include <string>
#include <vector>

#include "test_support.h"

namespace ms::test {

inline double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Each row of dim scaled to length `scale`, computed independently of the kernels under test.
inline void normalise_rows(std::vector<float>& x, int dim, double scale) {
  for (size_t r = 0; r < x.size() / size_t(dim); ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    for (int i = 0; i < dim; ++i) x[r * dim + i] = float(x[r * dim + i] / std::sqrt(ss) * scale);
  }
}

struct DeltaCase {
  int T, hk, hv, dk, dv;
  std::vector<float> q, k, v, g, beta, state;

  std::string name() const {
    return "T=" + std::to_string(T) + " heads " + std::to_string(hk) + "/" + std::to_string(hv) +
           " dk=" + std::to_string(dk) + " dv=" + std::to_string(dv);
  }
};

inline DeltaCase make_delta_case(Rng& rng, int T, int hk, int hv, int dk, int dv, bool random_state) {
  DeltaCase c{T, hk, hv, dk, dv, {}, {}, {}, {}, {}, {}};
  c.q = rng.normals(size_t(T) * hk * dk);
  normalise_rows(c.q, dk, 1.0 / std::sqrt(double(dk)));
  c.k = rng.normals(size_t(T) * hk * dk);
  normalise_rows(c.k, dk, 1.0);
  c.v = rng.normals(size_t(T) * hv * dv);
  c.g.resize(size_t(T) * hv);
  c.beta.resize(c.g.size());
  for (size_t i = 0; i < c.g.size(); ++i) {
    const double A = std::exp(rng.uniform(-3.0f, std::log(16.0f)));  // drawn first: a fixed order
    c.g[i] = float(-A * softplus(rng.normal(2.0f)));
    if (rng.uniform(0, 1) < 0.03f) c.g[i] = -rng.uniform(20, 200);
    c.beta[i] = float(sigmoid(rng.normal(2.0f)));
  }
  c.state = random_state ? rng.normals(size_t(hv) * dk * dv, 0.5f) : std::vector<float>(size_t(hv) * dk * dv, 0.0f);
  return c;
}

}  // namespace ms::test
