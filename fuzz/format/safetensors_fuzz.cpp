// The safetensors header parser (format/safetensors.cpp). The input is the header's JSON text,
// then optionally a NUL byte and the data section; the harness writes the 8-byte header length
// in front, so that mutations reach the JSON and the extents rather than only the length.
#include <cstring>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "fuzz_support.h"
#include "util/error.h"

namespace {

volatile uint8_t g_sink;  // where the bytes touched go, so that the reads are not optimised away

std::vector<uint8_t> safetensors_bytes(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const uint64_t header_len = nul ? uint64_t(nul - data) : size;
  std::vector<uint8_t> file(8);
  std::memcpy(file.data(), &header_len, 8);
  file.insert(file.end(), data, data + header_len);
  if (nul) file.insert(file.end(), nul + 1, data + size);
  return file;
}

// Every accepted tensor must lie inside the file and have the bytes its dtype and shape need.
void check_tensors(const ms::SafetensorsFile& f, size_t file_size) {
  for (const auto& [name, t] : f.tensors()) {
    size_t bytes = ms::dtype_size(t.dtype);
    for (int64_t d : t.shape)
      if (d < 0 || __builtin_mul_overflow(bytes, size_t(d), &bytes))
        ms::fuzz::accepted_invalid("tensor '" + name + "' with a negative or overflowing extent");
    if (bytes != t.nbytes)
      ms::fuzz::accepted_invalid("tensor '" + name + "' whose byte count differs from dtype x shape");
    if (t.nbytes > file_size) ms::fuzz::accepted_invalid("tensor '" + name + "' larger than the file");
    // Touches every byte: an extent outside the mapping faults here.
    uint8_t sum = 0;
    for (size_t i = 0; i < t.nbytes; ++i) sum += static_cast<const uint8_t*>(t.data)[i];
    g_sink = sum;
    if (t.nbytes <= 4096 && (t.dtype == ms::DType::F32 || t.dtype == ms::DType::BF16 || t.dtype == ms::DType::F16))
      (void)t.to_f32();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> file = safetensors_bytes(data, size);
  const std::string path = ms::fuzz::write_scratch("model.safetensors", file.data(), file.size());
  try {
    ms::SafetensorsFile f(path);
    check_tensors(f, file.size());
  } catch (const ms::Error& e) {
    // A refused file: the expected outcome for most inputs.
    ms::fuzz::refused(e);
  }
  return 0;
}
