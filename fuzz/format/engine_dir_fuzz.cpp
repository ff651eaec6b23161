// The engine index (format/engine_dir.cpp): moestream.json text, read against the config of
// models/pycoder-moe-q4 and opened over a copy of that directory's real expert blobs (29 MB, in
// the scratch directory: a blob must lie inside the engine directory), so an accepted index
// also has its records located and checksummed.
#include <filesystem>
#include <set>
#include <string>

#include "format/config.h"
#include "format/engine_dir.h"
#include "fuzz_support.h"
#include "util/error.h"

namespace {
namespace fs = std::filesystem;

const char* const kModel = "models/pycoder-moe-q4";

// The scratch directory as an engine directory: the input becomes its index.
void copy_real_blobs() {
  const fs::path experts = fs::path(ms::fuzz::scratch_dir()) / "experts";
  if (!fs::exists(experts)) fs::copy(ms::fuzz::source_path(kModel) + "/experts", experts, fs::copy_options::recursive);
}

// What the index may not name: a blob outside the directory, or one layer twice.
void check_layers(const ms::EngineIndex& index) {
  std::set<std::string> names;
  for (const auto& l : index.layers) {
    const fs::path file = fs::path(l.file).lexically_normal();
    if (file.is_absolute() || file.empty() || *file.begin() == "..")
      ms::fuzz::accepted_invalid("an expert blob outside the directory: " + l.file);
    if (!names.insert(l.name).second) ms::fuzz::accepted_invalid("layer " + l.name + " listed twice");
  }
}

// Locates the first and the last record of each layer and checks the first one's checksum.
void read_records(const ms::ExpertBlobs& blobs) {
  for (const auto& l : blobs.index().layers) {
    (void)blobs.record(l, l.n_experts - 1);
    blobs.verify(l, 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ms::ModelConfig cfg = ms::load_config(ms::fuzz::source_path(kModel) + "/config.json");
  copy_real_blobs();
  ms::fuzz::write_scratch(ms::kEngineIndexFile, data, size);
  try {
    const ms::EngineIndex index = ms::read_engine_index(ms::fuzz::scratch_dir(), cfg);
    check_layers(index);
    read_records(ms::ExpertBlobs(ms::fuzz::scratch_dir(), index));
  } catch (const ms::Error& e) {
    // A refused index, or records that do not match it: the expected outcome for most inputs.
    ms::fuzz::refused(e);
  }
  return 0;
}
