#pragma once
// A small engine directory for tests that need one of their own (not in test_support: the
// ThreadSanitizer build links no runtime layer).
#include <cstdint>
#include <string>

#include "writers/synth.h"
#include "test_support.h"

namespace ms::test {

// A random-weight `synth --like tiny` engine directory in a scratch directory.
inline std::string synth_tiny(const std::string& tag, uint64_t seed = 7, bool mtp = false) {
  SynthOptions opt;
  opt.shape = synth_shape("tiny");
  opt.out = scratch_dir(tag) + "/model";
  opt.seed = seed;
  opt.mtp = mtp;
  synth_model(opt);
  return opt.out;
}

}  // namespace ms::test
