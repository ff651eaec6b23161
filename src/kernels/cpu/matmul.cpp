// y = x · Wᵀ for f32 and bf16 weights, SIMD through Highway with runtime dispatch; affine-quantized
// weights go to matmul_quant.
// Each output y[t, r] is one dot product whose value depends only on x[t] and row r, never on
// T or on which other rows share the batch: the MoE may regroup tokens (waves, streaming)
// without changing a bit of the answer.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_matmul.h"
#include "util/thread_pool.h"

HWY_BEFORE_NAMESPACE();
namespace ms::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float Dot(const float* a, const float* b, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + L), hn::LoadU(d, b + i + L), s1);
    s2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * L), hn::LoadU(d, b + i + 2 * L), s2);
    s3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * L), hn::LoadU(d, b + i + 3 * L), s3);
  }
  for (; i + L <= n; i += L) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void Bf16ToF32(const uint16_t* src, float* dst, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::bfloat16_t, decltype(d)> dbf;
  const size_t L = hn::Lanes(d);
  const auto* s = reinterpret_cast<const hwy::bfloat16_t*>(src);
  size_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dbf, s + i)), d, dst + i);
  for (; i < n; ++i) dst[i] = hwy::F32FromBF16(s[i]);
}

// Rows [r0, r1) of y for all T tokens.
void MatmulRows(const float* x, int T, const Mat& W, float* y, int r0, int r1) {
  thread_local std::vector<float> row;
  const size_t K = size_t(W.cols);
  for (int r = r0; r < r1; ++r) {
    const float* w;
    if (W.type == WeightType::F32) {
      w = static_cast<const float*>(W.data) + size_t(r) * K;
    } else {
      row.resize(K);
      Bf16ToF32(static_cast<const uint16_t*>(W.data) + size_t(r) * K, row.data(), K);
      w = row.data();
    }
    for (int t = 0; t < T; ++t) y[size_t(t) * size_t(W.rows) + size_t(r)] = Dot(x + size_t(t) * K, w, K);
  }
}

}  // namespace ms::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ms::cpu {

HWY_EXPORT(MatmulRows);

void matmul(const float* x, int T, const Mat& W, float* y) {
  if (W.type == WeightType::Affine) return matmul_quant(x, T, W.quant(), y);
  // Enough rows per chunk to amortise scheduling; the weight row is the unit of reuse.
  const size_t grain = size_t(std::max(1, 16384 / std::max(1, W.cols)));
  ThreadPool::global().parallel_for(
      size_t(W.rows),
      [&](size_t r0, size_t r1) { HWY_DYNAMIC_DISPATCH(MatmulRows)(x, T, W, y, int(r0), int(r1)); }, grain);
}

}  // namespace ms::cpu
#endif
