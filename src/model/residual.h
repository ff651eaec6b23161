#pragma once
// What follows each block of a decoder layer (model/blocks.h): the residual add and the norm of
// the next block's input, x += out, then normed = rmsnorm(x) · (offset + w). The block ends with
// it, so that a backend may fold it into the block's last launch (the CUDA one does, for a decode
// token). x, w and normed live where the backend keeps activations.

namespace ms {

struct ResidualNorm {
  float* x;          // [T, hidden]: the residual stream, added to in place
  const float* w;    // [hidden]: the next norm's weights
  float offset, eps;
  float* normed;     // [T, hidden]
};

}  // namespace ms
