#pragma once
// The compute stream: every kernel, device copy and stream-ordered allocation of the CUDA backend
// goes to this one stream (made on first use), but for a SideStream's work. A created stream, not the legacy default one, so
// that a decode step can be captured into a CUDA graph; a blocking one, so that the synchronous
// copies (cudaMemcpy, on the legacy stream) still wait for the work queued on it and it for them.
#include <cuda_runtime_api.h>

namespace ms::cuda {
cudaStream_t compute_stream();

// Work beside the compute stream's: from a SideStream's making to its end(), compute_stream() on
// this thread is a second stream, which first waits for all the compute stream has queued, so
// that what is queued meanwhile may run beside what the compute stream queues after end(); join()
// (or the destructor) makes the compute stream wait for it. On the GPU a decode step's shared
// expert runs so beside the router and the routing. Between making and end(), nothing may take or
// give back device memory: buffers are reused in the compute stream's order alone. Captured into
// a graph, the two become branches of it.
class SideStream {
 public:
  SideStream();
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  void end();   // compute_stream() the compute stream again
  void join();  // end(), and the compute stream waits for what was queued on the side

 private:
  bool joined_ = false;
};
}  // namespace ms::cuda
