#pragma once
// The CPU's executor (model/executor.h): the forward over CpuBackend, decode steps one forward
// each, the host's expert pool.
#include <memory>

#include "model/executor.h"
#include "model/model.h"

namespace ms {

// Runs `model` (whose experts, if streamed, are the host store's) on the CPU.
std::unique_ptr<Executor> make_cpu_executor(const Model& model);

}  // namespace ms
