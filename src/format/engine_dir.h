#pragma once
// The engine model directory (docs/FORMAT.md): moestream.json (the index), dense.safetensors,
// experts/*.bin (one blob per MoE layer, expert e one contiguous record at e * stride) and the
// checkpoint's config and tokenizer files. This file owns the record layout and the index:
// the converter plans and writes it, the loader reads and verifies it.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/config.h"
#include "quant/affine.h"
#include "format/safetensors.h"

namespace ms {

inline constexpr const char* kEngineIndexFile = "moestream.json";
inline constexpr const char* kEngineDenseFile = "dense.safetensors";
inline constexpr const char* kEngineFormatName = "moestream";
// Version 3: checksums are XXH3-64 (XXH64 before). Version 2: record headers, dense checksums.
inline constexpr int kEngineFormatVersion = 3;        // what convert and synth write
inline constexpr int kOldestEngineFormatVersion = 1;  // still read: no record headers, no dense checksums
inline constexpr size_t kExpertStrideAlign = 4096;  // O_DIRECT reads of whole records
inline constexpr size_t kRecordRegionAlign = 64;    // every region of a record starts on a cache line
inline constexpr int kRawBits = 16;                 // "bits" of an unquantized bf16 projection
// From version 2 every record starts with a header naming its layer and expert (RecordHeader).
inline constexpr size_t kRecordHeaderBytes = 64;
inline constexpr char kRecordMagic[8] = {'M', 'S', 'E', 'X', 'P', 'R', 'T', '2'};

// The projections of an expert, in record order.
inline constexpr std::array<const char*, 3> kExpertProjections = {"gate", "up", "down"};

// Where one projection [rows, cols] of an expert lies inside its record. bits 16: q holds the
// raw bf16 weights and there are no scales or biases (their sizes are 0).
struct ProjLayout {
  int bits = kRawBits, group = 0, rows = 0, cols = 0;
  size_t q_offset = 0, q_bytes = 0;
  size_t scales_offset = 0, biases_offset = 0, scales_bytes = 0;  // [rows, cols/group] of scale_type each
  ScaleType scale_type = ScaleType::BF16;
};

struct ExpertLayer {
  std::string name;  // tensor prefix of the MoE block: "model.layers.3.mlp", "mtp.layers.0.mlp"
  std::string file;  // relative to the directory: "experts/layer_003.bin"
  int n_experts = 0;
  int version = kEngineFormatVersion;  // the format version of its layout, header and checksums
  size_t header_bytes = 0;  // kRecordHeaderBytes from version 2, 0 in version 1
  size_t record_bytes = 0;  // bytes a record uses; the checksum covers these
  size_t stride = 0;        // record_bytes rounded up to kExpertStrideAlign; the rest is zero
  std::array<ProjLayout, 3> proj;
  std::vector<uint64_t> checksums;  // content_checksum(version) of each record's record_bytes bytes
};

struct ProjSpec {
  int bits = kRawBits, group = 0, rows = 0, cols = 0;
  ScaleType scale_type = ScaleType::BF16;
};

// Lays out the record header (version 2), then gate, up, down (q, scales, biases each) one
// after another, each region aligned to kRecordRegionAlign. Throws naming `name` for an invalid
// bits/group/shape combination.
ExpertLayer plan_expert_layer(const std::string& name, const std::string& file, int n_experts,
                              const std::array<ProjSpec, 3>& spec, int version = kEngineFormatVersion);

struct EngineIndex;

// The fields at the start of a version-2 record's kRecordHeaderBytes, little-endian (as the host
// writes them); the rest of those bytes is zero. Lets every read check that the record is the
// one asked for without a full checksum.
struct RecordHeader {
  char magic[8];          // kRecordMagic
  uint32_t version;       // the format version (2 or 3)
  uint32_t expert;        // expert id within its layer
  uint64_t layer_hash;    // layer_name_hash(layer name)
  uint64_t record_bytes;  // the layer's record_bytes
  uint32_t n_experts;     // the layer's n_experts
};

uint64_t layer_name_hash(const std::string& name);

// Writes expert e's header at the start of rec (nothing for a version-1 layer).
void write_record_header(const ExpertLayer& layer, int e, uint8_t* rec);

// Checks that rec is expert e of `layer` (nothing for a version-1 layer): throws naming `file`,
// the layer and the expert asked for, and, when rec is a record of another layer or expert of
// `index`, which one it holds.
void check_record_header(const EngineIndex& index, const ExpertLayer& layer, int e, const uint8_t* rec,
                         const std::string& file);

// The expert blob file name of a MoE block ("model.layers.3.mlp" -> "experts/layer_003.bin",
// "mtp.layers.0.mlp" -> "experts/mtp_layer_000.bin").
std::string expert_file_name(const std::string& name);

// The checksum a format version keeps of n bytes: XXH64 (seed 0) before version 3, XXH3-64
// (seed 0) from it.
uint64_t content_checksum(int version, const void* data, size_t n);
// The checksum of a record of `layer` (its record_bytes bytes at rec).
uint64_t record_checksum(const ExpertLayer& layer, const void* rec);

// Checksums of dense.safetensors (from version 2): its header bytes and each tensor's bytes,
// content_checksum of the index's version.
struct DenseChecksums {
  uint64_t header = 0;
  std::map<std::string, uint64_t> tensors;
};

// The checksums of a safetensors file (what convert and synth store in the index), read in
// pieces with pread and dropped from the page cache behind, so memory does not grow with it.
DenseChecksums dense_checksums(const std::string& path, int version);

struct EngineIndex {
  std::string architecture;  // config.json's, e.g. "Qwen3NextForCausalLM"
  int dense_bits = kRawBits, dense_group = 0;
  std::vector<ExpertLayer> layers;
  int version = kEngineFormatVersion;
  DenseChecksums dense_checksums;  // version 2

  const ExpertLayer* find(const std::string& name) const;  // null when absent
  size_t widest_stride() const;  // the largest record stride of any layer (0 without layers)
};

// The index as moestream.json holds it; dims come from cfg. Keys are sorted and nothing
// depends on time or host, so the same conversion gives the same bytes.
std::string engine_index_json(const EngineIndex& index, const ModelConfig& cfg);

bool is_engine_dir(const std::string& dir);

// Files of the checkpoint an engine directory keeps as they were; config.json is required, the
// rest where the checkpoint has them.
inline constexpr std::array<const char*, 5> kEngineSideFiles = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                                                 "generation_config.json", "chat_template.jinja"};

// The files an engine directory ships, relative to it: the side files it has, the index, the
// dense weights and every expert blob the index names. What a copy of the model needs, and
// nothing a run or a tool left beside it.
std::vector<std::string> engine_dir_files(const std::string& dir, const EngineIndex& index);

// Reads and checks dir/moestream.json: format name and version, dense bits and group, every
// layer's name (a MoE layer of cfg, listed once), file (inside dir, symlinks resolved) and
// layout against the one plan_expert_layer computes, one checksum per expert, dims against cfg
// (the directory's config.json). Errors name the file, the layer and the field.
EngineIndex read_engine_index(const std::string& dir, const ModelConfig& cfg);

// The same checksums of a safetensors file already open (mapped or read into memory), from its
// bytes there: what a load verifies without reading the file a second time.
DenseChecksums dense_checksums(const SafetensorsFile& file, int version);

// The check of the dense weights at load (on unless --no-verify): dense.safetensors, as loaded,
// against index.dense_checksums (its header, then every tensor), throwing naming the file and
// the tensor that differs. A version-1 index has no dense checksums: nothing to check
// (docs/FORMAT.md).
void verify_dense(const SafetensorsFile& dense, const EngineIndex& index);

// The expert blobs of an engine directory, mmap'ed; sizes checked against the index.
class ExpertBlobs {
 public:
  ExpertBlobs(const std::string& dir, const EngineIndex& index);
  const EngineIndex& index() const { return index_; }
  // Record of expert e of `layer`, which must be one of index().layers.
  const uint8_t* record(const ExpertLayer& layer, int e) const;
  // Recomputes expert e's checksum; throws naming file, layer and expert on a mismatch.
  void verify(const ExpertLayer& layer, int e) const;

 private:
  std::string dir_;
  EngineIndex index_;
  std::vector<std::unique_ptr<MappedFile>> maps_;  // parallel to index_.layers
};

}  // namespace ms
