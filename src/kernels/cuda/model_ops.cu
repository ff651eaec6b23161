// The small glue kernels of the model's forward on the GPU: the shared expert's gate, the
// gather/scatter around the routed experts, and a decode step's embedding and end where steps
// feed each other on the GPU. Each follows the loop it replaces in src/model/ (formulas in ops.h);
// elementwise, so results match the CPU's up to expf.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;

// Block t's row: out[t] += gate · s[t], the shared expert's gated add.
__device__ void gated_add_row(float* out, const float* s, float gate, int H) {
  float* o = out + size_t(blockIdx.x) * H;
  const float* sr = s + size_t(blockIdx.x) * H;
  load_then_store<kThreads, 8>(
      H, [&](int h) { return make_float2(o[h], sr[h]); }, [&](int h, float2 v) { o[h] = v.x + gate * v.y; });
}

// Block t: the gate's dot with x[t] (bf16 weights), then out[t] += sigmoid(dot) · s[t].
__global__ void shared_gate_add_kernel(float* out, const float* s, const float* x, const uint16_t* w, int H) {
  start_after_kernel_before();  // launched by launch_after
  const float* xr = x + size_t(blockIdx.x) * H;
  float dot = 0.f;
#pragma unroll 8
  for (int h = threadIdx.x; h < H; h += kThreads) dot = fmaf(xr[h], bf16_to_float(w[h]), dot);
  gated_add_row(out, s, sigmoid(block_reduce<kThreads, false>(dot)), H);
}

// Block t: out[t] += sigmoid(logit[t]) · s[t], the gate's logits computed before (a float32 gate).
__global__ void shared_logit_add_kernel(float* out, const float* s, const float* logit, int H) {
  gated_add_row(out, s, sigmoid(logit[blockIdx.x]), H);
}

__global__ void gather_rows_kernel(const float* src, const int* rows, int H, float* dst) {
  const float* s = src + size_t(rows[blockIdx.x]) * H;
  for (int h = threadIdx.x; h < H; h += kThreads) dst[size_t(blockIdx.x) * H + h] = s[h];
}

__global__ void scatter_scaled_kernel(const float* y, const int* rows, const float* wt, int H, float* dst) {
  const float w = wt[blockIdx.x];
  float* d = dst + size_t(rows[blockIdx.x]) * H;
  for (int h = threadIdx.x; h < H; h += kThreads) d[h] = w * y[size_t(blockIdx.x) * H + h];
}

__global__ void sum_slots_kernel(const float* partial, int K, int H, float* out) {
  for (int h = threadIdx.x; h < H; h += kThreads) {
    float o = 0.f;
    for (int k = 0; k < K; ++k) o += partial[(size_t(blockIdx.x) * K + k) * H + h];
    out[size_t(blockIdx.x) * H + h] = o;
  }
}

// Row *id of an embedding table as embed_tokens (model/forward.cpp) dequantizes it on the host: bf16 widened, affine
// codes (an LSB-first bit stream a row, quant/affine.h) as scale · q + bias, rounded as the host's
// (unfused) product and sum.
__global__ void embed_row_kernel(Mat table, const int* id, float* out) {
  start_after_kernel_before();  // launched by launch_after
  const size_t row = size_t(*id);
  const int c = int(blockIdx.x * kThreads + threadIdx.x);
  if (c >= table.cols) return;
  if (table.type == WeightType::BF16) {
    out[c] = bf16_to_float(static_cast<const uint16_t*>(table.data)[row * table.cols + c]);
    return;
  }
  const uint8_t* q = static_cast<const uint8_t*>(table.data) + row * (size_t(table.cols) * table.bits / 8);
  const int bit = c * table.bits, shift = bit % 8;
  uint32_t word = q[bit / 8];
  if (shift + table.bits > 8) word |= uint32_t(q[bit / 8 + 1]) << 8;
  const uint32_t code = (word >> shift) & ((1u << table.bits) - 1);
  const size_t g = row * size_t(table.cols / table.group) + size_t(c / table.group);
  const ScaleType st = table.scale_type;
  const float scale = scale_at(table.scales, uint32_t(g), st), bias = scale_at(table.biases, uint32_t(g), st);
  out[c] = __fadd_rn(__fmul_rn(scale, float(code)), bias);
}

__global__ void finish_decode_step_kernel(const int* token, int* position, int* ring, int ring_mask, const int* routes,
                                          int n_routes, int* route_ring) {
  start_after_kernel_before();  // launched by launch_after
  const int pos = *position, slot = pos & ring_mask;
  for (int i = threadIdx.x; i < n_routes; i += kThreads) route_ring[size_t(slot) * n_routes + i] = routes[i];
  __syncthreads();  // every thread has read the position
  if (threadIdx.x != 0) return;
  ring[slot] = *token;
  *position = pos + 1;
}

}  // namespace

void embed_row(const Mat& table, const int* id, float* out) {
  if (table.type != WeightType::BF16 && table.type != WeightType::Affine)
    arg_fail("cuda::embed_row: the table must be bf16 or affine (an f32 one stays on the host)");
  const bool affine = table.type == WeightType::Affine;
  if (affine && (table.bits < 1 || table.bits > 8 || table.group <= 0 || table.cols % table.group))
    arg_fail("cuda::embed_row: affine table of " + std::to_string(table.bits) + " bits, group " +
             std::to_string(table.group) + " over " + std::to_string(table.cols) + " columns");
  if (table.cols <= 0) return;
  launch_after(embed_row_kernel, unsigned((table.cols + kThreads - 1) / kThreads), kThreads, 0, table, id, out);
  CUDA_CHECK_LAUNCH();
}

void finish_decode_step(const int* token, int* position, int* ring, int ring_size, const int* routes, int n_routes,
                        int* route_ring) {
  if (ring_size <= 0 || (ring_size & (ring_size - 1)))
    arg_fail("cuda::finish_decode_step: ring of " + std::to_string(ring_size) + " slots; a power of two");
  if (n_routes < 0 || (n_routes > 0 && (!routes || !route_ring)))
    arg_fail("cuda::finish_decode_step: " + std::to_string(n_routes) + " routes without both their rows and ring");
  launch_after(finish_decode_step_kernel, 1, kThreads, 0, token, position, ring, ring_size - 1, routes, n_routes,
               route_ring);
  CUDA_CHECK_LAUNCH();
}

void shared_gate_add(float* out, const float* s, const float* x, const Mat& gate, int T, int H) {
  if (gate.type != WeightType::BF16 || gate.rows != 1 || gate.cols != H)
    arg_fail("cuda::shared_gate_add: the gate must be a bf16 [1, " + std::to_string(H) +
             "] row (engine directories never quantize gates)");
  if (T <= 0) return;
  launch_after(shared_gate_add_kernel, unsigned(T), kThreads, 0, out, s, x, static_cast<const uint16_t*>(gate.data), H);
  CUDA_CHECK_LAUNCH();
}

void shared_logit_add(float* out, const float* s, const float* logit, int T, int H) {
  if (T <= 0) return;
  shared_logit_add_kernel<<<unsigned(T), kThreads, 0, compute_stream()>>>(out, s, logit, H);
  CUDA_CHECK_LAUNCH();
}

void gather_rows(const float* src, const int* rows, int n, int H, float* dst) {
  if (n <= 0) return;
  gather_rows_kernel<<<unsigned(n), kThreads, 0, compute_stream()>>>(src, rows, H, dst);
  CUDA_CHECK_LAUNCH();
}

void scatter_scaled(const float* y, const int* rows, const float* wt, int n, int H, float* dst) {
  if (n <= 0) return;
  scatter_scaled_kernel<<<unsigned(n), kThreads, 0, compute_stream()>>>(y, rows, wt, H, dst);
  CUDA_CHECK_LAUNCH();
}

void sum_slots(const float* partial, int T, int K, int H, float* out) {
  if (T <= 0) return;
  sum_slots_kernel<<<unsigned(T), kThreads, 0, compute_stream()>>>(partial, K, H, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace ms::cuda
