#include "kernels/cuda/device.h"

#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "util/error.h"

namespace ms::cuda {

void cuda_fail(const char* file, int line, const char* call, cudaError_t err) {
  fail("{}:{}: {} failed: {} ({})", file, line, call, cudaGetErrorString(err), cudaGetErrorName(err));
}

void arg_fail(const std::string& msg) { throw Error(msg); }

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

namespace {
cudaStream_t new_stream() {
  cudaStream_t created;
  CUDA_CHECK(cudaStreamCreate(&created));  // never destroyed: work may be queued at exit
  return created;
}

cudaEvent_t new_event() {
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// This thread's side stream and the events that fork it from the compute stream and join it back.
struct Side {
  cudaStream_t stream = new_stream();
  cudaEvent_t forked = new_event(), done = new_event();
};

Side& side() {
  thread_local Side* s = new Side;  // never destroyed, as the streams
  return *s;
}

thread_local bool t_on_side = false;  // a SideStream of this thread redirects compute_stream()

cudaStream_t main_stream() {
  static const cudaStream_t s = new_stream();
  return s;
}
}  // namespace

cudaStream_t compute_stream() { return t_on_side ? side().stream : main_stream(); }

SideStream::SideStream() {
  if (t_on_side) fail("a SideStream inside another");
  Side& s = side();
  CUDA_CHECK(cudaEventRecord(s.forked, main_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.forked, 0));
  t_on_side = true;
}

void SideStream::end() {
  if (!t_on_side) return;
  t_on_side = false;
  CUDA_CHECK(cudaEventRecord(side().done, side().stream));
}

void SideStream::join() {
  end();
  if (joined_) return;
  joined_ = true;
  CUDA_CHECK(cudaStreamWaitEvent(main_stream(), side().done, 0));
}

SideStream::~SideStream() {
  // No throwing from a destructor: a failure here shows at the next check.
  if (t_on_side) t_on_side = false, cudaEventRecord(side().done, side().stream);
  if (!joined_) cudaStreamWaitEvent(main_stream(), side().done, 0);
}

void synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

size_t free_memory() {
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

HostRegistration::HostRegistration(void* p, size_t bytes) {
  if (!p || !bytes) return;
  CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
  ptr_ = p;
}

HostRegistration::~HostRegistration() {
  if (ptr_) cudaHostUnregister(ptr_);
}

namespace {
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

ComputeMark::ComputeMark() {
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
}

ComputeMark::~ComputeMark() {
  if (event_) cudaEventDestroy(as_event(event_));
}

void ComputeMark::record() { CUDA_CHECK(cudaEventRecord(as_event(event_), compute_stream())); }

void ComputeMark::wait() const { CUDA_CHECK(cudaEventSynchronize(as_event(event_))); }

ComputeTimer::ComputeTimer() {
  for (void** e : {&start_, &stop_}) {
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreate(&ev));
    *e = ev;
  }
}

ComputeTimer::~ComputeTimer() {
  for (void* e : {start_, stop_}) cudaEventDestroy(as_event(e));
}

void ComputeTimer::start() {
  CUDA_CHECK(cudaEventRecord(as_event(start_), compute_stream()));
  stopped_ = false;
}

void ComputeTimer::stop() {
  CUDA_CHECK(cudaEventRecord(as_event(stop_), compute_stream()));
  stopped_ = true;
}

double ComputeTimer::take_elapsed_s() {
  if (!stopped_) return 0;
  stopped_ = false;
  CUDA_CHECK(cudaEventSynchronize(as_event(stop_)));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, as_event(start_), as_event(stop_)));
  return double(std::max(0.f, ms)) / 1e3;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) CUDA_CHECK(cudaHostAlloc(&p_, bytes, cudaHostAllocDefault));
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

MappedInts::MappedInts(size_t n) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(n, 1) * sizeof(int), cudaHostAllocMapped));
  host_ = static_cast<int*>(p);
  void* d = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&d, p, 0);
  if (err != cudaSuccess) cudaFreeHost(p);
  CUDA_CHECK(err);
  device_ = static_cast<int*>(d);
}

MappedInts::~MappedInts() {
  if (host_) cudaFreeHost(const_cast<int*>(host_));
}

Graph::~Graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}

void Graph::begin_capture() {
  // Relaxed: what is captured takes its memory with cudaMalloc while the capture is open
  // (kernels/cuda/device_memory.h's DeviceArena), which the stricter modes refuse.
  CUDA_CHECK(cudaStreamBeginCapture(compute_stream(), cudaStreamCaptureModeRelaxed));
}

void Graph::end_capture() {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(compute_stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(err);
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = exec;
}

void Graph::abort_capture() noexcept {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(compute_stream(), &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();  // what cut the capture short is being reported already
}

void Graph::launch() const { CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), compute_stream())); }

CopyStream::CopyStream() {
  // Non-blocking: the legacy default stream (synchronous copies) would otherwise serialise with it.
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  for (void** e : {&start_, &stop_, &ready_, &marked_}) {
    cudaEvent_t ev;
    CUDA_CHECK(cudaEventCreate(&ev));
    *e = ev;
  }
}

CopyStream::~CopyStream() {
  cudaStreamSynchronize(as_stream(stream_));
  for (void* e : {start_, stop_, ready_, marked_}) cudaEventDestroy(as_event(e));
  cudaStreamDestroy(as_stream(stream_));
}

void CopyStream::begin(const ComputeMark& after) {
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), as_event(after.event()), 0));
  CUDA_CHECK(cudaEventRecord(as_event(start_), as_stream(stream_)));
}

void CopyStream::copy(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream_)));
  if (pace_s_per_byte_ > 0) wait_on_stream(stream_, double(bytes) * pace_s_per_byte_);
}

void CopyStream::pace(double rate, double native) {
  if (!(rate > 0)) pace_s_per_byte_ = 0;
  else if (!(native > 0)) pace_s_per_byte_ = 1.0 / rate;  // the native rate unknown: the whole time
  else pace_s_per_byte_ = native > rate ? 1.0 / rate - 1.0 / native : 0.0;
}

void CopyStream::copy_on_device(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream_)));
}

void CopyStream::end() {
  CUDA_CHECK(cudaEventRecord(as_event(ready_), compute_stream()));
  CUDA_CHECK(cudaEventRecord(as_event(stop_), as_stream(stream_)));
  CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), as_event(stop_), 0));
}

CopyStream::Times CopyStream::finish() {
  CUDA_CHECK(cudaEventSynchronize(as_event(stop_)));
  CUDA_CHECK(cudaEventSynchronize(as_event(ready_)));
  float copy_ms = 0, wait_ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&copy_ms, as_event(start_), as_event(stop_)));
  CUDA_CHECK(cudaEventElapsedTime(&wait_ms, as_event(ready_), as_event(stop_)));
  return {double(copy_ms) / 1e3, double(std::max(0.f, wait_ms)) / 1e3};
}

void CopyStream::mark() { CUDA_CHECK(cudaEventRecord(as_event(marked_), as_stream(stream_))); }

bool CopyStream::marked_done() const {
  const cudaError_t e = cudaEventQuery(as_event(marked_));
  if (e == cudaErrorNotReady) return false;
  CUDA_CHECK(e);
  return true;
}

void CopyStream::wait_marked() const { CUDA_CHECK(cudaEventSynchronize(as_event(marked_))); }

}  // namespace ms::cuda
