// The GGUF reader (format/gguf.cpp) and the block decoders behind the import
// (quant/gguf_blocks.cpp). The input is the whole file.
#include <string>
#include <vector>

#include "format/gguf.h"
#include "fuzz_support.h"
#include "quant/gguf_blocks.h"
#include "util/error.h"

namespace {

volatile uint8_t g_sink;  // where the bytes touched go, so that the reads are not optimised away

// Every accepted tensor lies inside the file with the bytes its type and shape need, and its first
// row of a block type decodes.
void check_tensors(const ms::GgufFile& f, size_t file_size) {
  for (const ms::GgufTensor& t : f.tensors()) {
    int values = 0, bytes = 0;
    if (!ms::ggml_type_info(t.type, &values, &bytes)) ms::fuzz::accepted_invalid("tensor '" + t.name + "' of an unknown type");
    if (t.nbytes > file_size) ms::fuzz::accepted_invalid("tensor '" + t.name + "' larger than the file");
    uint8_t sum = 0;
    for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];  // an extent outside the mapping faults here
    g_sink = sum;
    ms::GgufAffine layout;
    if (!ms::gguf_affine_layout(t.type, &layout) || t.row_length() > 4096) continue;
    const size_t cols = size_t(t.row_length());
    std::vector<uint8_t> codes(cols);
    std::vector<uint16_t> scales(cols), biases(cols);
    (void)ms::gguf_row_to_affine(t.type, t.data, int(cols), layout, codes.data(), scales.data(), biases.data());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ms::fuzz::write_scratch("model.gguf", data, size);
  try {
    const auto f = ms::GgufFile::open(path);
    check_tensors(*f, size);
    for (const char* key : {"general.architecture", "tokenizer.ggml.tokens"})
      if (f->has(key)) g_sink = uint8_t(f->meta(key).size());
  } catch (const ms::Error& e) {
    ms::fuzz::refused(e);  // a refused file: the expected outcome for most inputs
  }
  return 0;
}
