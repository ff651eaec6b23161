// The CUDA backend's entry points in a build without it (nvcc was not found at configure time):
// CMake compiles this file instead of the rest of backends/cuda/.
#include "backends/cuda/cuda_executor.h"
#include "util/error.h"

namespace ms {

bool cuda_backend_available() { return false; }

void check_cuda_load(const ModelOptions&) {
  fail("--device cuda: this build has no CUDA backend (nvcc was not found when it was configured)");
}

std::unique_ptr<Executor> make_cuda_executor(Model&, const std::string&, const ModelOptions& opt) {
  check_cuda_load(opt);
  return nullptr;
}

const DeviceExpertStore* vram_pool(const Model&) { return nullptr; }
bool decode_graphs(const Model&) { return false; }
bool decodes_ahead(const Model&) { return false; }

}  // namespace ms
