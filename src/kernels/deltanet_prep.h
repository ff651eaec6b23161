#pragma once
// What deltanet_prepare reads and writes for T tokens, on either kernel set (cpu::deltanet_prepare
// is the reference cuda::deltanet_prepare is tested against): Qwen3-Next's in_proj_qkvz output
// qkvz [T][nk][q(dk), k(dk), v(r·dv), z(r·dv)] (r = nv / nk) and in_proj_ba's ba
// [T][nk][b(r), a(r)]; the conv over the channels (all q, all k, all v) with weights conv_w
// [channels][conv_k] and its state conv_state [channels][conv_k − 1], carried.
namespace ms {

struct DeltaNetPrep {
  const float *qkvz, *ba, *conv_w, *A, *dt_bias;  // A = −exp(A_log)
  float* conv_state;
  float *q, *k, *v, *z, *g, *beta;
  int T, nk, nv, dk, dv, conv_k;
  float eps, q_scale;
};

}  // namespace ms
