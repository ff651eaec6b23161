#pragma once
// Writing an engine model directory (docs/FORMAT.md) in bounded memory: what the converter
// (weights from a checkpoint) and the synthesizer (random weights) share. The caller supplies
// the values; this file owns the temporary directory, the dense quantization rules and
// pieces, the expert blob writer and the progress bar.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

#include "format/engine_dir.h"
#include "util/progress.h"
#include "format/safetensors.h"

namespace ms {

// Values of a dense tensor processed at a time: bounds the writers' buffers whatever the
// tensor's size (16 MB as float32).
inline constexpr size_t kDenseChunkValues = size_t(1) << 22;

// The output directory under a temporary name beside the final one (OUT.tmp-XXXXXX); removed
// unless committed, so a failed or interrupted write never leaves a directory that looks valid.
// Its writer holds an flock on the file kWriterLock inside it for its whole life, so that one
// killed outright (SIGKILL, power loss) leaves a directory the next writer to OUT recognises as
// dead and removes (remove_dead_temp_dirs); a live writer's is left alone.
class TempDir {
 public:
  static constexpr const char* kWriterLock = ".writer.lock";
  explicit TempDir(const std::filesystem::path& out);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // Renames it to `out`; an existing `out` is replaced only with `force`.
  void commit(const std::filesystem::path& out, bool force);

 private:
  std::filesystem::path path_;
  int lock_fd_ = -1;  // kWriterLock, flocked while the directory is being written
};

// Removes OUT.tmp-* directories beside `out` whose writer is gone (kWriterLock not held); returns
// how many. TempDir's constructor calls it.
int remove_dead_temp_dirs(const std::filesystem::path& out);

// docs/FORMAT.md, "dense.safetensors": the bits a dense tensor is stored with given
// --dense-bits/--dense-group (kRawBits: as stored).
int dense_bits_for(const std::string& name, const std::vector<int64_t>& shape, bool is_float, int dense_bits,
                   int dense_group);

// Declares the output tensors of one dense tensor (itself, or NAME.q/.scales/.biases when
// bits < 16); returns the index of its first one.
size_t add_dense_specs(const std::string& name, DType dtype, const std::vector<int64_t>& shape, int bits, int group,
                       std::vector<TensorSpec>* specs);

// Rows a dense piece of `cols` columns holds (at least one).
size_t dense_rows_per_piece(size_t cols);

// Quantizes rows [r0, r0 + n) of a matrix given as float32 `w` [n, cols] into the three
// tensors starting at `first_spec`. `what` names the tensor in errors.
void write_quantized_rows(SafetensorsWriter& w, size_t first_spec, size_t r0, const float* rows, int n, int cols,
                          int bits, int group, const std::string& what);

// One projection of an expert into its place in `rec`: quantized per `pl`, or as bf16 when
// pl.bits is kRawBits.
void put_projection(const ProjLayout& pl, const float* w, uint8_t* rec, const std::string& what);

// Writes dir/layout.file: fill(e, rec, scratch) makes record e (rec is stride bytes, zeroed;
// scratch a float buffer of the worker's own) on a worker thread, done(e) runs after it is
// written. Records layout.checksums. The blob is
// flushed and dropped from the page cache at the end, so a memory-limited cgroup is not
// filled by dirty output.
void write_expert_blob(const std::filesystem::path& dir, ExpertLayer& layout,
                       const std::function<void(size_t e, std::vector<uint8_t>& rec, std::vector<float>& scratch)>& fill,
                       const std::function<void(size_t e)>& done);

// Throws "FLAG: BITS is not one of A, B, ..." unless bits is among `allowed`.
void check_bits(const char* flag, int bits, std::initializer_list<int> allowed);

// Writes and flushes a small text file.
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace ms
