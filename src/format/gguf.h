#pragma once
// A GGUF file (llama.cpp's format, versions 2 and 3), mmap'ed read-only: its metadata and its
// tensors, each a view of its bytes. Everything is checked against the file's size before use;
// errors name the file and the key or tensor.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quant/gguf_blocks.h"  // GgmlType, ggml_type_info

namespace ms {

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the row length (the innermost dimension)
  uint32_t type = 0;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t row_length() const { return ne.empty() ? 1 : ne[0]; }
  int64_t rows() const;  // the product of ne[1..]
};

class GgufFile {
 public:
  static std::unique_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  // Metadata as JSON values (integers, floats, bools, strings, arrays of them).
  bool has(const std::string& key) const { return meta_.count(key) != 0; }
  const nlohmann::json& meta(const std::string& key) const;  // throws naming the key
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  std::string string(const std::string& key) const;

  bool has_tensor(const std::string& name) const { return index_.count(name) != 0; }
  const GgufTensor& tensor(const std::string& name) const;  // throws naming the tensor
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // Drops the pages of a consumed tensor (the file is mmap'ed).
  void release(const GgufTensor& t) const;

 private:
  GgufFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, nlohmann::json> meta_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace ms
