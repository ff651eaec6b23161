#pragma once
// Loading a model onto the backend that runs it.
#include <memory>
#include <string>

#include "model/model.h"

namespace ms {

// Cuda when this build has the CUDA backend and a GPU it can run on is present, else Cpu.
Device default_device();

// A Hugging Face checkpoint directory or an engine directory (moestream.json, written by
// `moestream convert`), run on opt.device.
std::unique_ptr<Model> load_model(const std::string& dir, const ModelOptions& opt = {});

}  // namespace ms
