// Causal GQA attention over the KV cache. A job is one token and one KV head: the group of query
// heads that share that head read each key and value row together, so the cache is read once per
// group instead of once per head. A job takes its positions in chunks of kChunk; within a chunk
// the softmax is exact (its max, exponentials and sum), and the chunks are folded in position
// order, each rescaled to the running max. The chunks depend only on a token's own positions, so
// its output is the same bits whatever T is and however the work is split among threads: a decode
// token's few jobs compute their chunks in parallel and then fold them in the same order, where a
// prompt's many jobs each fold theirs as they go. A bf16 or quantized cache (quant/kv_quant.h) is
// decoded a chunk of one KV head at a time into the job's scratch, once for its group of heads.
// Compiled once per SIMD target by Highway's foreach_target and picked at run time.
// AVX-512, AVX2 and the portable fallback, as quant_matmul.cpp: the SSE targets would only add
// build time.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// Highway's vector exp; after foreach_target so that it is compiled for each target.
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/matmul_tile-inl.h"
#include "kernels/cpu/ops.h"
#include "util/error.h"
#include "util/half.h"
#include "util/thread_pool.h"

#ifndef MS_ATTENTION_SHARED_ONCE
#define MS_ATTENTION_SHARED_ONCE
namespace ms::cpu::attention_detail {

constexpr int kChunk = 128;  // positions: a chunk's key and value rows stay in the L2 for its heads

// The hd codes of a quantized KV row (quant/affine.h's bit stream) as bytes; hd a multiple of 8.
// Eight codes of `bits` ≤ 4 are one word of 8·bits bits (read as 4 bytes: the row's scales follow
// its codes, so the read stays in the row), spread a code a byte.
inline uint64_t Spread(uint32_t w, int bits) {
  uint64_t v = 0;
  for (int j = 0; j < 8; ++j) v |= uint64_t((w >> (j * bits)) & ((1u << bits) - 1)) << (8 * j);
  return v;
}
#if defined(__x86_64__)
// BMI2's pdep spreads the eight codes in one instruction.
__attribute__((target("bmi2"))) inline void UnpackCodesBmi2(const uint8_t* row, int hd, int bits, uint8_t* q) {
  const uint64_t lanes = 0x0101010101010101ull * ((1u << bits) - 1);
  for (int i = 0; i < hd / 8; ++i) {
    uint32_t w;
    std::memcpy(&w, row + size_t(i) * size_t(bits), 4);
    const uint64_t v = _pdep_u64(w, lanes);
    std::memcpy(q + 8 * i, &v, 8);
  }
}
inline bool HasBmi2() {
  static const bool has = __builtin_cpu_supports("bmi2");
  return has;
}
#endif
inline void UnpackCodes(const uint8_t* row, int hd, int bits, uint8_t* q) {
  if (bits == 8) {
    std::memcpy(q, row, size_t(hd));
    return;
  }
#if defined(__x86_64__)
  if (HasBmi2()) return UnpackCodesBmi2(row, hd, bits, q);
#endif
  for (int i = 0; i < hd / 8; ++i) {
    uint32_t w;
    std::memcpy(&w, row + size_t(i) * size_t(bits), 4);
    const uint64_t v = Spread(w, bits);
    std::memcpy(q + 8 * i, &v, 8);
  }
}

// One chunk's softmax for the G heads of a group: max m, sum l of exp(score - m), and
// acc [G, hd] = Σ exp(score - m) · v.
struct Partial {
  float* m;
  float* l;
  float* acc;
};

}  // namespace ms::cpu::attention_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace ms::cpu::HWY_NAMESPACE {
using namespace ms::cpu::attention_detail;

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

namespace {

// scores[j] = scale · q·k_j for the R key rows k_j = k + j·ldk, each its own vector chain (their
// loads overlap), then the tail dims in turn.
template <int R>
void Dots(const float* HWY_RESTRICT q, const float* HWY_RESTRICT k, size_t ldk, size_t n, float scale,
          float* HWY_RESTRICT scores) {
  const DF d;
  const size_t L = hn::Lanes(d);
  hn::Vec<DF> acc[R];
  for (int j = 0; j < R; ++j) acc[j] = hn::Zero(d);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto qv = hn::LoadU(d, q + i);
    for (int j = 0; j < R; ++j) acc[j] = hn::MulAdd(qv, hn::LoadU(d, k + size_t(j) * ldk + i), acc[j]);
  }
  for (int j = 0; j < R; ++j) {
    float s = hn::GetLane(hn::SumOfLanes(d, acc[j]));
    for (size_t t = i; t < n; ++t) s = std::fma(q[t], k[size_t(j) * ldk + t], s);
    scores[j] = s * scale;
  }
}

// x[i] = exp(x[i] - m), returning their sum; the tail through the same vector code (padded), so
// that a value's exponential does not depend on where in the chunk it sits.
float ExpSum(float* x, size_t n, float m) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const auto vm = hn::Set(d, m);
  auto sum = hn::Zero(d);
  size_t i = 0;
  for (; i + L <= n; i += L) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vm));
    hn::StoreU(e, d, x + i);
    sum = hn::Add(sum, e);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, sum));
  if (i < n) {
    HWY_ALIGN float pad[HWY_LANES(float)];
    std::fill(pad, pad + L, m);  // exp(0) in the unused lanes, not added
    std::copy(x + i, x + n, pad);
    hn::Store(hn::Exp(d, hn::Sub(hn::Load(d, pad), vm)), d, pad);
    for (size_t j = 0; j < n - i; ++j) s += (x[i + j] = pad[j]);
  }
  return s;
}

}  // namespace

// The chunk of n positions for the G query heads q [G, hd] of one KV head: kc and vc its first key
// and value rows, ldk and ldv their strides (floats). scores: G·kChunk floats.
void AttendChunk(const float* q, const float* kc, size_t ldk, const float* vc, size_t ldv, int hd, int G, int n_pos,
                 float scale, float* scores, Partial out) {
  const size_t n = size_t(n_pos);
  for (int g = 0; g < G; ++g) {
    float* sc = scores + size_t(g) * kChunk;
    const float* qg = q + size_t(g) * size_t(hd);
    size_t s = 0;
    for (; s + 4 <= n; s += 4) Dots<4>(qg, kc + s * ldk, ldk, size_t(hd), scale, sc + s);
    for (; s < n; ++s) Dots<1>(qg, kc + s * ldk, ldk, size_t(hd), scale, sc + s);
    out.m[g] = *std::max_element(sc, sc + n);
    out.l[g] = ExpSum(sc, n, out.m[g]);
  }
  // acc [G, hd] = exp(scores) [G, n] · v [n, hd], the chunk's value rows read once for the group.
  std::fill(out.acc, out.acc + size_t(G) * size_t(hd), 0.f);
  Matmul(scores, kChunk, 1, vc, ldv, out.acc, size_t(hd), G, int(n), hd, 1.0f, false);
}

// Rows of a bf16 or quantized KV side as floats: n rows of hd at `stride` bytes from `rows`
// into out [n, hd]. A quantized row's values are scale·q + bias (one fused multiply-add).
void DecodeKvRows(const uint8_t* rows, size_t stride, int n, int bits, int group, int hd, float* HWY_RESTRICT out) {
  const DF d;
  const size_t L = hn::Lanes(d);
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<uint8_t, DF> d8;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  HWY_ALIGN uint8_t q[1024];
  for (int r = 0; r < n; ++r, rows += stride, out += hd) {
    if (bits == 16) {
      const uint16_t* b = reinterpret_cast<const uint16_t*>(rows);
      size_t i = 0;
      for (; i + L <= size_t(hd); i += L)
        hn::StoreU(hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, b + i)))), d, out + i);
      for (; i < size_t(hd); ++i) out[i] = bf16_to_f32(b[i]);
      continue;
    }
    UnpackCodes(rows, hd, bits, q);
    const uint16_t* params = reinterpret_cast<const uint16_t*>(rows + size_t(hd) * size_t(bits) / 8);
    const int groups = hd / group;
    for (int g = 0; g < groups; ++g) {
      const auto scale = hn::Set(d, f16_to_f32(params[g])), bias = hn::Set(d, f16_to_f32(params[groups + g]));
      for (size_t i = size_t(g) * size_t(group); i < size_t(g + 1) * size_t(group); i += L) {
        const auto codes = hn::ConvertTo(d, hn::BitCast(di, hn::PromoteTo(du, hn::LoadU(d8, q + i))));
        hn::StoreU(hn::MulAdd(scale, codes, bias), d, out + i);
      }
    }
  }
}

// The running softmax `run` of G heads takes in the chunk `c`: both rescaled to their common max.
// run starts at m -inf, l 0, acc 0 (its scale exp(-inf) is then 0).
void Fold(int G, int hd, const Partial& c, Partial run) {
  for (int g = 0; g < G; ++g) {
    const float m = std::max(run.m[g], c.m[g]);
    const float a = std::exp(run.m[g] - m), b = std::exp(c.m[g] - m);
    run.m[g] = m;
    run.l[g] = run.l[g] * a + c.l[g] * b;
    float* acc = run.acc + size_t(g) * size_t(hd);
    const float* cacc = c.acc + size_t(g) * size_t(hd);
    for (int i = 0; i < hd; ++i) acc[i] = acc[i] * a + cacc[i] * b;
  }
}

}  // namespace ms::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ms::cpu {
using namespace attention_detail;

HWY_EXPORT(AttendChunk);
HWY_EXPORT(DecodeKvRows);
HWY_EXPORT(Fold);

namespace {

// Partials of n heads of hd: m, l and acc side by side in one buffer.
struct Partials {
  Partials(size_t n, int hd) : m(n, -INFINITY), l(n, 0.f), acc(n * size_t(hd), 0.f), hd(hd) {}
  Partial at(size_t head) { return {m.data() + head, l.data() + head, acc.data() + head * size_t(hd)}; }
  std::vector<float> m, l, acc;
  int hd;
};

int chunks_of(int len) { return (len + kChunk - 1) / kChunk; }

// out [G, hd] = run's acc / l.
void finish(const Partial& run, int G, int hd, float* out) {
  for (int g = 0; g < G; ++g)
    for (size_t i = size_t(g) * size_t(hd); i < size_t(g + 1) * size_t(hd); ++i) out[i] = run.acc[i] / run.l[g];
}

// What a thread's chunks use: the scores, and where a side is not float32 its decoded rows.
struct Scratch {
  Scratch(int G, int hd, KvRows k, KvRows v)
      : scores(size_t(G) * kChunk),
        k(k.side.bits == 32 ? 0 : size_t(kChunk) * size_t(hd)),
        v(v.side.bits == 32 ? 0 : size_t(kChunk) * size_t(hd)) {}
  std::vector<float> scores, k, v;
};

// Positions [s0, s1) of KV head kvh as float rows: in place where the side is float32, else
// decoded into buf. ld: their stride in floats.
const float* chunk_rows(KvRows r, int n_kv, int kvh, int hd, int s0, int s1, std::vector<float>& buf, size_t& ld) {
  const size_t row = r.side.row_bytes(hd), stride = size_t(n_kv) * row;
  const uint8_t* first = r.data + size_t(s0) * stride + size_t(kvh) * row;
  if (r.side.bits == 32) {
    ld = size_t(n_kv) * size_t(hd);
    return reinterpret_cast<const float*>(first);
  }
  HWY_DYNAMIC_DISPATCH(DecodeKvRows)(first, stride, s1 - s0, r.side.bits, r.side.group, hd, buf.data());
  ld = size_t(hd);
  return buf.data();
}

}  // namespace

void attention(const float* q, const float* k, const float* v, int T, int pos0, int n_heads, int n_kv, int hd,
               float* out) {
  attention(q, KvRows{reinterpret_cast<const uint8_t*>(k), KvSide{}}, KvRows{reinterpret_cast<const uint8_t*>(v), KvSide{}},
            T, pos0, n_heads, n_kv, hd, out);
}

void attention(const float* q, KvRows k, KvRows v, int T, int pos0, int n_heads, int n_kv, int hd, float* out) {
  check_kv_side(k.side, hd, "cpu::attention keys");
  check_kv_side(v.side, hd, "cpu::attention values");
  if ((k.side.bits != 32 || v.side.bits != 32) && hd > 1024) fail("cpu::attention: head_dim {} is above 1024", hd);
  const int G = n_heads / n_kv;
  const float scale = 1.0f / std::sqrt(float(hd));
  const size_t jobs = size_t(T) * size_t(n_kv);
  // Job t · n_kv + kvh: token t's query heads kvh · G .. kvh · G + G - 1, which share KV head kvh.
  auto q_of = [&](size_t job) {
    return q + (job / size_t(n_kv) * size_t(n_heads) + job % size_t(n_kv) * size_t(G)) * size_t(hd);
  };
  auto out_of = [&](size_t job) { return out + (q_of(job) - q); };
  auto len_of = [&](size_t job) { return pos0 + int(job / size_t(n_kv)) + 1; };
  auto attend = [&](size_t job, int c, Scratch& sc, Partial p) {
    const int s0 = c * kChunk, s1 = std::min(len_of(job), s0 + kChunk), kvh = int(job % size_t(n_kv));
    size_t ldk, ldv;
    const float* kc = chunk_rows(k, n_kv, kvh, hd, s0, s1, sc.k, ldk);
    const float* vc = chunk_rows(v, n_kv, kvh, hd, s0, s1, sc.v, ldv);
    HWY_DYNAMIC_DISPATCH(AttendChunk)(q_of(job), kc, ldk, vc, ldv, hd, G, s1 - s0, scale, sc.scores.data(), p);
  };

  // Few jobs (a decode token's): every chunk of every job in parallel, then each job's fold.
  ThreadPool& pool = ThreadPool::global();
  std::vector<size_t> first_chunk{0};  // where each job's chunks start, counted for few jobs only
  if (jobs < 4 * size_t(pool.size()))
    for (size_t j = 0; j < jobs; ++j) first_chunk.push_back(first_chunk.back() + size_t(chunks_of(len_of(j))));
  const size_t chunks = first_chunk.back();
  constexpr size_t kMaxPartialFloats = size_t(16) << 20;
  if (chunks > jobs && chunks * size_t(G) * size_t(hd + 2) <= kMaxPartialFloats) {
    Partials parts(chunks * size_t(G), hd);
    pool.parallel_for(chunks, [&](size_t b, size_t e) {
      Scratch sc(G, hd, k, v);
      for (size_t i = b; i < e; ++i) {
        const auto after = std::upper_bound(first_chunk.begin(), first_chunk.end(), i);
        const size_t job = size_t(after - first_chunk.begin()) - 1;
        attend(job, int(i - first_chunk[job]), sc, parts.at(i * size_t(G)));
      }
    });
    pool.parallel_for(jobs, [&](size_t b, size_t e) {
      for (size_t job = b; job < e; ++job) {
        Partials run(size_t(G), hd);
        for (size_t i = first_chunk[job]; i < first_chunk[job + 1]; ++i)
          HWY_DYNAMIC_DISPATCH(Fold)(G, hd, parts.at(i * size_t(G)), run.at(0));
        finish(run.at(0), G, hd, out_of(job));
      }
    });
    return;
  }
  // Many jobs over a packed cache: a block of kTokens consecutive tokens of one KV head decodes each
  // chunk once for all its tokens, each folding its chunks in order (the same bits as alone).
  if (k.side.bits != 32 || v.side.bits != 32) {
    constexpr int kTokens = 16;
    const size_t blocks = size_t((T + kTokens - 1) / kTokens) * size_t(n_kv);
    pool.parallel_for(blocks, [&](size_t b, size_t e) {
      Scratch sc(G, hd, k, v);
      Partials chunk(size_t(G), hd);
      for (size_t blk = b; blk < e; ++blk) {
        const int kvh = int(blk % size_t(n_kv)), t0 = int(blk / size_t(n_kv)) * kTokens, t1 = std::min(T, t0 + kTokens);
        Partials run(size_t(t1 - t0) * size_t(G), hd);
        const int last = pos0 + t1;  // the positions the block's last token attends
        for (int c = 0; c < chunks_of(last); ++c) {
          const int s0 = c * kChunk;
          size_t ldk, ldv;
          const float* kc = chunk_rows(k, n_kv, kvh, hd, s0, std::min(last, s0 + kChunk), sc.k, ldk);
          const float* vc = chunk_rows(v, n_kv, kvh, hd, s0, std::min(last, s0 + kChunk), sc.v, ldv);
          for (int t = std::max(t0, s0 - pos0); t < t1; ++t) {  // the tokens that attend position s0
            const size_t job = size_t(t) * size_t(n_kv) + size_t(kvh);
            const int n = std::min(len_of(job), s0 + kChunk) - s0;
            HWY_DYNAMIC_DISPATCH(AttendChunk)(q_of(job), kc, ldk, vc, ldv, hd, G, n, scale, sc.scores.data(), chunk.at(0));
            HWY_DYNAMIC_DISPATCH(Fold)(G, hd, chunk.at(0), run.at(size_t(t - t0) * size_t(G)));
          }
        }
        for (int t = t0; t < t1; ++t)
          finish(run.at(size_t(t - t0) * size_t(G)), G, hd, out_of(size_t(t) * size_t(n_kv) + size_t(kvh)));
      }
    });
    return;
  }
  // Many jobs (a prompt's): each folds its chunks as it computes them.
  pool.parallel_for(jobs, [&](size_t b, size_t e) {
    Scratch sc(G, hd, k, v);
    Partials chunk(size_t(G), hd);
    for (size_t job = b; job < e; ++job) {
      Partials run(size_t(G), hd);
      for (int c = 0; c < chunks_of(len_of(job)); ++c) {
        attend(job, c, sc, chunk.at(0));
        HWY_DYNAMIC_DISPATCH(Fold)(G, hd, chunk.at(0), run.at(0));
      }
      finish(run.at(0), G, hd, out_of(job));
    }
  });
}

}  // namespace ms::cpu
#endif
