// A CUDA injection library (libms_cuda_trace.so) that records, through CUPTI's activity API, when
// each kernel, copy and memset ran on the GPU (a CUDA graph's nodes each on their own) and each
// CUDA runtime call on the host, and at the program's exit prints trace_summary's account of it to
// stderr: where a replayed decode step's time goes, node by node, and the host's gap between
// steps. The program is not rebuilt:
//
//   export CUDA_INJECTION64_PATH=$PWD/build/bench/libms_cuda_trace.so  # MS_TRACE_OUT=trace.tsv too
//   build/moestream generate --device cuda --model DIR --ids 1000,2000 --max-tokens 64 --ignore-eos
//
// MS_TRACE_OUT keeps the records (bench_trace_summary reads them back). Tracing costs the host
// time at each CUDA call, so the gaps between steps come out longer than untraced; the nodes'
// times within a step are the GPU's own timestamps (CUPTI may add a little to each).
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "bench/trace_summary.h"

namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;

std::mutex g_mu;
std::vector<ms::trace::Record>* g_records = new std::vector<ms::trace::Record>;  // never freed: used at exit

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    default: return "other";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *buf = static_cast<uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, kBufferBytes));
  *size = *buf ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mu);
  CUpti_Activity* a = nullptr;
  while (cuptiActivityGetNextRecord(buf, valid, &a) == CUPTI_SUCCESS) {
    ms::trace::Record r;
    if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
      r = {'K', k->start, k->end, k->streamId, k->graphId, k->graphNodeId, k->correlationId,
           int(k->gridX * k->gridY * k->gridZ), int(k->blockX * k->blockY * k->blockZ), 0, k->name ? k->name : "?"};
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
      r = {'C', c->start, c->end, c->streamId, c->graphId, c->graphNodeId, c->correlationId, 0, 0, c->bytes,
           copy_kind(c->copyKind)};
    } else if (a->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* c = reinterpret_cast<const CUpti_ActivityAPI*>(a);
      const char* name = nullptr;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, c->cbid, &name) != CUPTI_SUCCESS || !name) name = "?";
      r = {'A', c->start, c->end, c->threadId, 0, 0, c->correlationId, 0, 0, 0, name};
    } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(a);
      r = {'S', m->start, m->end, m->streamId, m->graphId, m->graphNodeId, m->correlationId, 0, 0, m->bytes, "device"};
    } else {
      continue;
    }
    g_records->push_back(std::move(r));
  }
  std::free(buf);
}

void report_at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  if (const char* path = std::getenv("MS_TRACE_OUT")) {
    if (FILE* f = std::fopen(path, "w")) {
      ms::trace::write_tsv(*g_records, f);
      std::fclose(f);
    } else {
      std::fprintf(stderr, "cuda_trace: cannot write MS_TRACE_OUT %s\n", path);
    }
  }
  std::fprintf(stderr, "cuda_trace: ");
  ms::trace::summarize(*g_records, stderr);
}

bool ok(CUptiResult r, const char* call) {
  if (r == CUPTI_SUCCESS) return true;
  const char* what = nullptr;
  cuptiGetResultString(r, &what);
  std::fprintf(stderr, "cuda_trace: %s failed: %s; tracing nothing\n", call, what ? what : "?");
  return false;
}

}  // namespace

// Called by the CUDA driver at its initialisation where CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection(void) {
  if (!ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks"))
    return 0;
  for (CUpti_ActivityKind k :
       {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
        CUPTI_ACTIVITY_KIND_RUNTIME})
    if (!ok(cuptiActivityEnable(k), "cuptiActivityEnable")) return 0;
  std::atexit(report_at_exit);
  return 1;
}
