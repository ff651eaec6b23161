#pragma once
// The dense weights in VRAM: every matrix and vector the forward reads, found by host address.
#include <cstdint>
#include <initializer_list>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/device_memory.h"
#include "model/weights.h"

namespace ms {

// Every matrix and vector of ModelWeights copied to VRAM, found by its host address (the experts
// of a checkpoint's MoE layers too; an engine directory's stream through the VRAM pool). f32
// matrices are refused: cuda::matmul reads bf16 and affine weights.
class DeviceWeights {
 public:
  explicit DeviceWeights(const ModelWeights& w);
  const Mat& mat(const Mat& host) const;
  // The matrix of the parts' rows in order, where they were copied as one (add_stack), else null.
  const Mat* stacked(std::initializer_list<const Mat*> parts) const;
  const float* vec(const std::vector<float>& host) const;
  size_t bytes() const { return bytes_; }
  // The embedding table too, for decode steps that embed their token on the GPU
  // (CudaExecutor's decode ahead), where it takes no more than `room` bytes and is not f32; has(embed)
  // then tells whether it is in VRAM (a tied lm_head's always is).
  void add_embedding(const Mat& embed, uint64_t room);
  bool has(const Mat& host) const { return mats_.count(host.data) != 0; }

 private:
  struct Stack {
    Mat whole;
    std::vector<const void*> parts;  // their host addresses, in order
  };
  void add(const Mat& m);
  // Matrices a forward multiplies by the same x, as one matrix of their rows where they share a
  // format and width (else each alone), so that a decode token's product is one launch.
  void add_stack(const std::vector<const Mat*>& parts);
  void upload_rows(const std::vector<const Mat*>& parts);
  void add(const std::vector<float>& v);
  std::vector<cuda::DeviceArray<unsigned char>> buffers_;
  std::unordered_map<const void*, Mat> mats_;
  std::unordered_map<const void*, Stack> stacks_;  // by the first part's host address
  std::unordered_map<const float*, const float*> vecs_;
  size_t bytes_ = 0;
};

}  // namespace ms
