#pragma once
// safetensors: mmap'ed reading of single files and sharded checkpoints, and a small writer.
// Every malformed input is reported with the file and the tensor at fault.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "util/memory.h"

namespace ms {

enum class DType { BF16, F16, F32, I8, I16, I32, I64, U8, U32 };

const char* dtype_name(DType t);
size_t dtype_size(DType t);
bool parse_dtype(const std::string& s, DType* out);

struct TensorView {
  std::string name;
  std::string file;  // the file it lives in, for error messages
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
  int64_t dim(int i) const { return shape.at(size_t(i)); }
  // Throws naming file and tensor unless dtype and shape are as expected (-1 = any extent).
  void expect(DType t, const std::vector<int64_t>& want) const;
  // Copies the values out as float32 (bf16/f16/f32 only).
  std::vector<float> to_f32() const;
  template <class T>
  const T* as() const { return static_cast<const T*>(data); }
};

// Where a file's bytes live once open: a read-only map of the file (the page cache, which a
// memory cap may evict and re-read), or the process's own memory, read in whole at open.
enum class Residence { Mapped, Memory };

// A whole file's bytes, read-only.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path, Residence residence = Residence::Mapped);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  ResidentMemory memory_;  // Residence::Memory: the bytes
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path, Residence residence = Residence::Mapped);
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return map_.path(); }
  size_t data_begin() const { return data_begin_; }  // 8 + the header's length: where tensor bytes start
  const uint8_t* file_data() const { return map_.data(); }

 private:
  MappedFile map_;
  size_t data_begin_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint: `model.safetensors`, or the shards that
// `model.safetensors.index.json` names, or a single file given directly.
class TensorStore {
 public:
  static TensorStore open(const std::string& path, Residence residence = Residence::Mapped);
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;  // throws: missing tensor, naming where
  std::vector<std::string> names() const;
  const std::string& where() const { return where_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string where_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

// A tensor to write: bytes are copied as given (little-endian host layout).
struct TensorData {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A tensor declared to SafetensorsWriter before any of its bytes exist.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t nbytes() const;
};

// Writes a safetensors file in bounded memory: every tensor is declared up front (the header
// is written at once, data offsets in declaration order), then its bytes are written in
// pieces, in any order. Output is a function of the specs and bytes only (no metadata).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<TensorSpec>& specs);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // Writes n bytes at byte `offset` of tensor i (0-based declaration index).
  void write(size_t i, size_t offset, const void* data, size_t n);
  void close();  // flushes to disk; throws on failure

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<size_t> begin_, size_;
};

// pwrite of all n bytes, failing with the path on error.
void pwrite_all(int fd, const void* data, size_t n, size_t offset, const std::string& path);

TensorData make_f32_tensor(const std::string& name, std::vector<int64_t> shape, const float* v);
void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors);

}  // namespace ms
