#pragma once
// The expert blobs of an engine directory, open for reading records through an asynchronous
// IoEngine (ExpertStore submits a layer's misses together). Every record read is checked: I/O errors, short reads (a truncated blob), its
// record header (version 2: the layer and expert it holds) and, with `verify`, the record's
// checksum; a failure names the file, layer and expert.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "experts/io_engine.h"
#include "format/engine_dir.h"

namespace ms {

class ExpertFiles {
 public:
  ExpertFiles(const std::string& dir, const EngineIndex& index, IoKind io, bool direct_io, bool verify);
  ~ExpertFiles();
  ExpertFiles(const ExpertFiles&) = delete;
  ExpertFiles& operator=(const ExpertFiles&) = delete;

  const std::string& dir() const { return dir_; }
  const EngineIndex& index() const { return index_; }
  const char* io_name() const { return io_->name(); }

  // The read of record `expert` of `layer` into dst (4 KiB aligned, stride bytes), for engine().
  ReadOp read_op(int layer, int expert, uint8_t* dst) const;
  // Checks a completed read_op: throws naming the file, layer and expert where the read failed,
  // came up short, or the record's header (or, with verify, its checksum) is not this expert's.
  void check(int layer, int expert, const ReadOp& op) const;
  IoEngine& engine() const { return *io_; }

 private:
  std::string dir_;
  EngineIndex index_;
  bool verify_;
  std::vector<int> fds_;
  std::unique_ptr<IoEngine> io_;
};

}  // namespace ms
