#pragma once
// The compute stream: every kernel, device copy and stream-ordered allocation of the CUDA backend
// goes to this one stream (made on first use). A created stream, not the legacy default one, so
// that a decode step can be captured into a CUDA graph; a blocking one, so that the synchronous
// copies (cudaMemcpy, on the legacy stream) still wait for the work queued on it and it for them.
#include <cuda_runtime_api.h>

namespace ms::cuda {
cudaStream_t compute_stream();
}  // namespace ms::cuda
