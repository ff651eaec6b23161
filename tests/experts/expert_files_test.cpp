// The streaming path's own checks on the blobs it opens and the records it reads: exact blob
// sizes, and (format version 2) a record of the wrong layer or expert named on its first read,
// with or without --verify, on a real synthesized engine directory.
#include "experts/expert_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "experts/expert_store.h"
#include "format/config.h"
#include "writers/synth.h"
#include "synth_support.h"
#include "test_support.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::synth_tiny;
using test::expect_error;

TEST(ExpertFiles, BlobOfAnyOtherSizeIsRefusedAtOpen) {
  const std::string dir = synth_tiny("blob-size", 3);
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  const std::string blob = dir + "/experts/layer_002.bin";
  const uintmax_t size = fs::file_size(blob);
  for (uintmax_t wrong : {size + 1, size + 4096, size - 1}) {
    SCOPED_TRACE(wrong);
    fs::resize_file(blob, wrong);
    for (IoKind io : {IoKind::Uring, IoKind::Pread})
      expect_error([&] { ExpertFiles(dir, index, io, true, false); },
                   {"layer_002.bin", "model.layers.2.mlp", std::to_string(wrong) + " bytes", "exactly"});
  }
  fs::resize_file(blob, size);
  EXPECT_NO_THROW(ExpertFiles(dir, index, IoKind::Pread, true, false));
}

// Two layers of the same shape whose blobs trade places: sizes, layouts and (without --verify)
// nothing else tell them apart; the record header does, on the first read.
TEST(ExpertFiles, SwappedLayerBlobsAreNamedOnTheFirstRead) {
  const std::string dir = synth_tiny("blob-swap", 3);
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  fs::rename(dir + "/experts/layer_000.bin", dir + "/experts/tmp.bin");
  fs::rename(dir + "/experts/layer_001.bin", dir + "/experts/layer_000.bin");
  fs::rename(dir + "/experts/tmp.bin", dir + "/experts/layer_001.bin");
  for (bool verify : {false, true})
    for (IoKind io : {IoKind::Uring, IoKind::Pread}) {
      SCOPED_TRACE(verify);
      ExpertStore store(dir, index, {.slots = 8, .io = io, .verify = verify, .top_k = 4});
      expect_error([&] { store.acquire(store.layer_of("model.layers.0.mlp"), {5, 9}); },
                   {"layer_000.bin", "layer model.layers.0.mlp, expert 5", "holds expert 5 of layer model.layers.1.mlp"});
      // The pool stays consistent: the failed experts are not resident, a retry fails the same way.
      expect_error([&] { store.acquire(store.layer_of("model.layers.1.mlp"), {7}); },
                   {"layer_001.bin", "expert 7", "of layer model.layers.0.mlp"});
      expect_error([&] { store.acquire(store.layer_of("model.layers.0.mlp"), {5}); }, {"expert 5"});
      EXPECT_NO_THROW(store.acquire(store.layer_of("model.layers.2.mlp"), {5}));
      store.release(store.layer_of("model.layers.2.mlp"));
    }
}

// Records moved inside one blob (expert 3's bytes where expert 4's belong): the header names it.
TEST(ExpertFiles, RecordOfAnotherExpertIsNamed) {
  const std::string dir = synth_tiny("record-move", 3);
  const EngineIndex index = read_engine_index(dir, load_config(dir));
  const ExpertLayer& l = index.layers[3];
  const std::string blob = dir + "/" + l.file;
  std::string bytes;
  {
    std::ifstream in(blob, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::copy_n(bytes.begin() + std::ptrdiff_t(3 * l.stride), l.stride, bytes.begin() + std::ptrdiff_t(4 * l.stride));
  std::ofstream(blob, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  ExpertStore store(dir, index, {.slots = 8, .io = IoKind::Pread, .top_k = 4});
  EXPECT_NO_THROW(store.acquire(3, {3}));
  store.release(3);
  expect_error([&] { store.acquire(3, {4}); }, {l.file, "expert 4", "holds expert 3 of layer model.layers.3.mlp"});
}

}  // namespace
}  // namespace ms
