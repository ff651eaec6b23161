#pragma once
// A GPU activity trace (what bench/cuda_trace.cpp records through CUPTI) and its summary: where a
// replayed CUDA graph's time goes, node by node, and what the host does between replays.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ms::trace {

struct Record {
  char kind = 'K';  // K a kernel, C a copy, S a memset, A a CUDA runtime call on the host
  uint64_t start = 0, end = 0;  // ns, CUPTI's clock (the GPU's and the host's times on one scale)
  uint32_t stream = 0, graph = 0;  // stream: the host thread for A; graph 0: outside a graph
  uint64_t node = 0;
  uint32_t correlation = 0;  // CUPTI's id of the API call that launched it
  int grid = 0, block = 0;  // blocks, and threads a block: kernels only
  uint64_t bytes = 0;       // copies and memsets only
  std::string name;         // a kernel's mangled name; "HtoD", "DtoH", ... for a copy; a call's name
};

// One record a line, tab-separated, in Record's field order.
void write_tsv(const std::vector<Record>& records, FILE* f);
// Throws ms::Error naming the line that is not a record.
std::vector<Record> read_tsv(FILE* f, const std::string& what);

// "attention_kernel", "matvec_mma<4, 64, false>": the demangled name without its namespaces,
// return type and parameters.
std::string short_name(const std::string& mangled);

// The graph replayed most often (a decode step): replays, the median span, the median host gap
// between replays and what ran there (on the GPU, and the host's calls), then each node's median
// start and duration within a replay, and the nodes' time by kernel. Without a graph replayed
// three times, GPU time by kernel.
void summarize(std::vector<Record> records, FILE* out);

}  // namespace ms::trace
