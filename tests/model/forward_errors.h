#pragma once
// The corrupt-record tests' search for a forward that reads the damaged expert
// (streaming_test.cpp on the CPU, cuda_streaming_test.cpp on the GPU).
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "util/error.h"

namespace ms::test {

// Runs forwards of up to 20 long, varied prompts (256 ids below 8192), each on model() with a
// fresh state, until one throws ms::Error; returns its message ("" when none threw), the prompt
// that threw (or the last one tried) in *prompt. Long prompts route most experts, so a damaged
// record is read within a few of them.
inline std::string first_forward_error(const std::function<Model&()>& model, std::vector<int>* prompt) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    Model& m = model();
    State s = m.new_state();
    prompt->clear();
    for (int t = 0; t < 256; ++t) prompt->push_back((t * 131 + attempt * 17) % 8192);
    try {
      m.forward(prompt->data(), int(prompt->size()), s);
    } catch (const Error& e) {
      return e.what();
    }
  }
  return "";
}

}  // namespace ms::test
