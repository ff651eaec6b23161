#include "backends/load.h"

#include "backends/cpu/cpu_executor.h"
#include "backends/cuda/cuda_executor.h"

namespace ms {

Device default_device() { return cuda_backend_available() ? Device::Cuda : Device::Cpu; }

std::unique_ptr<Model> load_model(const std::string& dir, const ModelOptions& opt) {
  if (opt.device == Device::Cuda) check_cuda_load(opt);
  std::unique_ptr<Model> m = Model::open(dir, opt);
  m->attach(opt.device == Device::Cuda ? make_cuda_executor(*m, dir, opt) : make_cpu_executor(*m));
  return m;
}

}  // namespace ms
