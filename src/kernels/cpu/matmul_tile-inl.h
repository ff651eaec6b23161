// The small register-tiled matmul of the CPU kernels' chunked forms (Gated DeltaNet's chunks,
// attention's chunks), for each SIMD target: included after hwy/foreach_target.h and
// hwy/highway.h, as Highway's -inl.h headers are (once per target, by the toggled guard).
#if defined(MS_KERNELS_CPU_MATMUL_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MS_KERNELS_CPU_MATMUL_TILE_INL_H_
#undef MS_KERNELS_CPU_MATMUL_TILE_INL_H_
#else
#define MS_KERNELS_CPU_MATMUL_TILE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>

HWY_BEFORE_NAMESPACE();
namespace ms::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register tile of the small matmuls: kTileRows rows by two vectors of columns. Written with
// Highway ops because the compiler's own vectorisation of it differs by target (for AVX2 it
// chose shuffles across p, far slower: docs/PERFORMANCE.md#cpu-matmul).
constexpr int kTileRows = 4;
constexpr int kTileCols = 2 * int(HWY_LANES(float));

// C[R, kTileCols] += alpha * A[R, P] · B[P, kTileCols], A(r, p) = a[r * a_rs + p * a_cs].
template <int R>
void MatmulTile(const float* a, size_t a_rs, size_t a_cs, int P, const float* b, size_t ldb, float alpha,
                float* c, size_t ldc) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  hn::Vec<hn::ScalableTag<float>> acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = hn::Zero(d);
  for (int p = 0; p < P; ++p) {
    const float* bp = b + size_t(p) * ldb;
    const auto b0 = hn::LoadU(d, bp), b1 = hn::LoadU(d, bp + L);
    for (int r = 0; r < R; ++r) {
      const auto ar = hn::Set(d, a[size_t(r) * a_rs + size_t(p) * a_cs]);
      acc[r][0] = hn::MulAdd(ar, b0, acc[r][0]);
      acc[r][1] = hn::MulAdd(ar, b1, acc[r][1]);
    }
  }
  const auto va = hn::Set(d, alpha);
  for (int r = 0; r < R; ++r) {
    float* cr = c + size_t(r) * ldc;
    hn::StoreU(hn::MulAdd(va, acc[r][0], hn::LoadU(d, cr)), d, cr);
    hn::StoreU(hn::MulAdd(va, acc[r][1], hn::LoadU(d, cr + L)), d, cr + L);
  }
}

// The same for cols <= kTileCols columns, plainly (the last columns of a row block).
template <int R>
void MatmulTileTail(const float* a, size_t a_rs, size_t a_cs, int P, const float* b, size_t ldb, float alpha,
                    float* c, size_t ldc, int cols) {
  float acc[R][kTileCols] = {};
  for (int p = 0; p < P; ++p)
    for (int r = 0; r < R; ++r) {
      const float ar = a[size_t(r) * a_rs + size_t(p) * a_cs];
      for (int j = 0; j < cols; ++j) acc[r][j] += ar * b[size_t(p) * ldb + j];
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < cols; ++j) c[size_t(r) * ldc + j] += alpha * acc[r][j];
}

template <int R>
void MatmulRowBlock(const float* a, size_t a_rs, size_t a_cs, int P, const float* b, size_t ldb, float alpha,
                    float* c, size_t ldc, int N) {
  int j = 0;
  for (; j + kTileCols <= N; j += kTileCols) MatmulTile<R>(a, a_rs, a_cs, P, b + j, ldb, alpha, c + j, ldc);
  if (j < N) MatmulTileTail<R>(a, a_rs, a_cs, P, b + j, ldb, alpha, c + j, ldc, N - j);
}

// C[M, N] += alpha * A[M, P] · B[P, N]; A(i, p) = a[i * a_rs + p * a_cs] (strides let a transposed
// operand be read in place), B and C row-major with leading dimensions ldb, ldc. lower: A is
// lower triangular (A(i, p) == 0 for p > i), and those terms are skipped.
inline void Matmul(const float* a, size_t a_rs, size_t a_cs, const float* b, size_t ldb, float* c, size_t ldc, int M,
            int P, int N, float alpha, bool lower) {
#if HWY_TARGET == HWY_SCALAR
  // GCC 12's SLP vectoriser turns the 4 x 2 register tile of this (SSE2-only) target into loads
  // one row of B past the last row (a segfault at a page end), so it takes plain loops instead.
  for (int i = 0; i < M; ++i)
    for (int p = 0; p < (lower ? std::min(P, i + 1) : P); ++p) {
      const float ap = alpha * a[size_t(i) * a_rs + size_t(p) * a_cs];
      for (int j = 0; j < N; ++j) c[size_t(i) * ldc + j] += ap * b[size_t(p) * ldb + j];
    }
#else
  for (int i = 0; i < M; i += kTileRows) {
    const int rows = std::min(kTileRows, M - i);
    const int depth = lower ? std::min(P, i + rows) : P;
    const float* ai = a + size_t(i) * a_rs;
    float* ci = c + size_t(i) * ldc;
    switch (rows) {
      case 4: MatmulRowBlock<4>(ai, a_rs, a_cs, depth, b, ldb, alpha, ci, ldc, N); break;
      case 3: MatmulRowBlock<3>(ai, a_rs, a_cs, depth, b, ldb, alpha, ci, ldc, N); break;
      case 2: MatmulRowBlock<2>(ai, a_rs, a_cs, depth, b, ldb, alpha, ci, ldc, N); break;
      default: MatmulRowBlock<1>(ai, a_rs, a_cs, depth, b, ldb, alpha, ci, ldc, N); break;
    }
  }
#endif
}

}  // namespace ms::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MS_KERNELS_CPU_MATMUL_TILE_INL_H_
