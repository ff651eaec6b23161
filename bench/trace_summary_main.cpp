// Prints trace_summary's account of a trace that libms_cuda_trace.so wrote (MS_TRACE_OUT), e.g. on
// another machine than the GPU's:  build/bench/bench_trace_summary trace.tsv
#include <cstdio>
#include <string>

#include "bench/trace_summary.h"
#include "util/error.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: bench_trace_summary TRACE.tsv (what libms_cuda_trace.so wrote to MS_TRACE_OUT)\n");
    return 2;
  }
  FILE* f = std::fopen(argv[1], "r");
  if (!f) {
    std::fprintf(stderr, "bench_trace_summary: cannot open %s\n", argv[1]);
    return 1;
  }
  try {
    const auto records = ms::trace::read_tsv(f, argv[1]);
    std::fclose(f);
    ms::trace::summarize(records, stdout);
  } catch (const ms::Error& e) {
    std::fprintf(stderr, "bench_trace_summary: %s\n", e.what());
    return 1;
  }
  return 0;
}
