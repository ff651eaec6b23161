#pragma once
// `moestream convert`: a Hugging Face checkpoint -> an engine model directory (docs/FORMAT.md),
// tensor by tensor from the mmap'ed shards in bounded memory. An MLX checkpoint (import_mlx.h)
// or a GGUF file (import_gguf.h) given as --from goes to its importer.
#include <map>
#include <string>

namespace ms {

struct ConvertOptions {
  std::string from, out;
  int expert_bits = 4;    // 2, 3, 4, 8 or 16 (bf16, unquantized)
  int expert_group = 64;  // 32, 64 or 128
  std::map<std::string, int> proj_bits;  // "gate"/"up"/"down" -> bits, over expert_bits
  std::map<std::string, int> layer_bits;  // "3" or "mtp" -> bits of every projection of that layer
  int dense_bits = 16;    // 16 (as stored), 8 or 4
  int dense_group = 64;
  std::string mtp_from;   // MLX import: the Hugging Face checkpoint to take `mtp.*` from
  bool force = false;     // replace an existing output directory
  bool progress = false;  // progress bar on stderr
  // The engine format written (docs/FORMAT.md): 3, or 1 or 2 only to make a directory of an
  // older version for the tests that it still loads.
  int format_version = 3;
};

struct ConvertStats {
  size_t bytes_in = 0;   // tensor bytes read from the checkpoint
  size_t bytes_out = 0;  // bytes of the output directory
  double seconds = 0;
};

ConvertStats convert_checkpoint(const ConvertOptions& opt);

// "gate=2,up=2,down=3" -> {gate: 2, up: 2, down: 3}; "3:2,mtp:8" -> {3: 2, mtp: 8}. Throws
// naming the flag and the item at fault.
std::map<std::string, int> parse_bits_list(const std::string& flag, const std::string& s, char sep);

}  // namespace ms
