#pragma once
// The CUDA backend's device plumbing, usable from plain C++ without CUDA headers: whether a GPU
// is there, waiting for queued work, and the copy stream that fills the expert pool. Device
// memory is kernels/cuda/device_memory.h's; kernels run on the compute stream (kernels/cuda/stream.h).
#include <cstddef>

namespace ms::cuda {

// True when a CUDA device and a driver that can run this build are present; never throws.
bool cuda_available();

// Waits for every kernel queued so far; throws ms::Error naming the failure of one of them.
void synchronize();

// Bytes of device memory free now.
size_t free_memory();

// Queues on `stream` (a cudaStream_t) a kernel of one thread that returns `seconds` after it
// starts: what CopyStream::pace waits with.
void wait_on_stream(void* stream, double seconds);

// Host memory registered with the driver (page-locked) for the lifetime of this object, so that
// copies from it run asynchronously at full PCIe speed.
class HostRegistration {
 public:
  HostRegistration() = default;
  HostRegistration(void* p, size_t bytes);
  ~HostRegistration();
  HostRegistration(HostRegistration&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  HostRegistration& operator=(HostRegistration&&) = delete;
  HostRegistration(const HostRegistration&) = delete;

 private:
  void* ptr_ = nullptr;
};

// Host ints the GPU writes to (page-locked and mapped): a kernel stores to device(), and the host
// reads host() once the work that stored there is done (ComputeMark::wait), with no copy queued
// behind the work after it.
class MappedInts {
 public:
  explicit MappedInts(size_t n);
  ~MappedInts();
  MappedInts(const MappedInts&) = delete;
  MappedInts& operator=(const MappedInts&) = delete;
  const volatile int* host() const { return host_; }
  int* device() const { return device_; }

 private:
  int* host_ = nullptr;
  int* device_ = nullptr;
};

// A point in the compute stream's queue (a CUDA event): record() marks the work queued so far.
// Before its first record() it stands for nothing to wait for.
class ComputeMark {
 public:
  ComputeMark();
  ~ComputeMark();
  ComputeMark(ComputeMark&& o) noexcept : event_(o.event_) { o.event_ = nullptr; }
  ComputeMark& operator=(ComputeMark&&) = delete;
  ComputeMark(const ComputeMark&) = delete;
  void record();
  void wait() const;  // on the host, until the marked work is done
  void* event() const { return event_; }  // cudaEvent_t

 private:
  void* event_ = nullptr;
};

// Two timed points of the compute stream's queue: start() and stop() record them, and once the
// work before stop() is done (a later wait on the host), elapsed_s() is the GPU time between.
class ComputeTimer {
 public:
  ComputeTimer();
  ~ComputeTimer();
  ComputeTimer(const ComputeTimer&) = delete;
  ComputeTimer& operator=(const ComputeTimer&) = delete;
  void start();
  void stop();
  bool stopped() const { return stopped_; }
  // 0 where stop() was not recorded since start(); takes the reading (stopped() is false after).
  double take_elapsed_s();

 private:
  void *start_ = nullptr, *stop_ = nullptr;  // cudaEvent_t
  bool stopped_ = false;
};

// Page-locked host memory of its own (cudaHostAlloc), for copies the compute stream queues
// without a wait: the owner reuses it only after a later wait on that stream.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  float* floats() const { return static_cast<float*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Work on the compute stream recorded once and queued again in one call: between begin_capture()
// and end_capture() what this thread queues on the compute stream is recorded, not run (so it
// may hold no host round trip), and launch() queues the recording with the arguments and
// addresses it was made with. A launch costs the host more than most of a decode step's kernels
// run for, which a graph pays once a step (docs/PERFORMANCE.md#cuda-graphs).
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void begin_capture();
  // Ends the capture and makes the graph launchable; throws naming the call that broke it.
  void end_capture();
  // Ends a capture that an exception cut short, dropping what was recorded.
  void abort_capture() noexcept;
  void launch() const;

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
};

// Copies to VRAM on their own stream, beside the compute stream. One batch at a time:
// begin(after) orders the batch after the compute marked by `after` (which may still read the
// slots being overwritten) and nothing else, so the copies overlap the compute queued since;
// copy() and copy_on_device() queue; end() makes later compute wait for the batch; finish() waits
// on the host and returns how long the batch's copies took on the GPU and how long the compute
// stream waited for them there. Copies queued outside a batch (a prefetch's) are ordered before
// every later batch, and mark() lets the host wait for them alone (wait_marked()).
class CopyStream {
 public:
  CopyStream();
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  void begin(const ComputeMark& after);
  void copy(void* dst, const void* src, size_t bytes);             // host to device
  void copy_on_device(void* dst, const void* src, size_t bytes);  // device to device
  void end();
  struct Times {
    double copy_s = 0;   // the batch's copies, begin() to end() on the copy stream
    double stall_s = 0;  // the compute stream's wait at end() for them
  };
  Times finish();
  // Marks the copies queued so far; marked_done() says whether they are done, wait_marked() waits.
  void mark();
  bool marked_done() const;
  void wait_marked() const;
  // A benchmark's slower link (--h2d-rate): from now on each host-to-device copy of n bytes is
  // followed on the copy stream by a wait of n / rate − n / native (native: the measured rate),
  // so that copies run at `rate` bytes a second (n / rate where native is 0: not measured).
  // A rate of 0 turns it off.
  void pace(double rate, double native);

 private:
  void* stream_ = nullptr;  // cudaStream_t
  double pace_s_per_byte_ = 0;
  void* start_ = nullptr, *stop_ = nullptr, *ready_ = nullptr, *marked_ = nullptr;  // cudaEvent_t
};

}  // namespace ms::cuda
