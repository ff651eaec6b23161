#pragma once
// The GPU's executor (model/executor.h): the dense weights in VRAM, the VRAM expert pool over the
// host tier, the forward over CudaBackend, a decode step replayed as the sequence's CUDA graph
// where every routed expert is resident, and greedy steps run ahead of the host.
#include <memory>
#include <string>
#include <vector>

#include "model/executor.h"
#include "model/model.h"

namespace ms {

class DeviceExpertStore;

// Whether this build has the CUDA backend and a GPU it can run on is present.
bool cuda_backend_available();

// Fails where a load on the GPU cannot run (no GPU, or this build has no CUDA backend) or was
// given options it does not take; before anything is read.
void check_cuda_load(const ModelOptions& opt);
// Runs `model` (Model::open'ed for Device::Cuda) on the GPU: its dense weights copied to VRAM, an engine directory's experts pooled
// there (the pools sized by --vram, or by the free VRAM; the plan set on the model).
std::unique_ptr<Executor> make_cuda_executor(Model& model, const std::string& dir, const ModelOptions& opt);

// The VRAM expert pool of a model on the CUDA backend; null for a checkpoint or another backend.
const DeviceExpertStore* vram_pool(const Model& model);
// Whether a model on the CUDA backend replays its decode steps as CUDA graphs
// (ModelOptions::cuda_graphs, and every routed expert resident in VRAM).
bool decode_graphs(const Model& model);
// Whether its greedy decode steps run ahead of the host (decode graphs and the embedding in VRAM).
bool decodes_ahead(const Model& model);

}  // namespace ms
