// The config loader (format/config.cpp): config.json text -> ModelConfig. What it accepts must
// be usable: the values the model computes with are in the ranges it assumes (issue 35 named
// partial_rotary_factor 2.0, rope_theta 0 and a negative eps, which ran and printed garbage).
#include <cmath>
#include <string>

#include "format/config.h"
#include "fuzz_support.h"
#include "util/error.h"

namespace {

void check_usable(const ms::ModelConfig& c) {
  using ms::fuzz::accepted_invalid;
  if (c.layer_types.size() != size_t(c.n_layers) || c.layer_moe.size() != size_t(c.n_layers))
    accepted_invalid("layer_types or layer_moe not one per layer");
  if (!(c.partial_rotary > 0.0f && c.partial_rotary <= 1.0f)) accepted_invalid("partial_rotary_factor outside (0, 1]");
  if (c.rotary_dim() < 0 || c.rotary_dim() > c.head_dim) accepted_invalid("a rotary dim outside [0, head_dim]");
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0.0)) accepted_invalid("rope_theta not finite and positive");
  if (!(std::isfinite(c.rms_eps) && c.rms_eps > 0.0f)) accepted_invalid("rms_norm_eps not finite and positive");
  if (c.n_kv_heads > c.n_heads) accepted_invalid("more key/value heads than attention heads");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ms::fuzz::write_scratch("config.json", data, size);
  try {
    check_usable(ms::load_config(path));
  } catch (const ms::Error& e) {
    // A refused config: the expected outcome for most inputs.
    ms::fuzz::refused(e);
  }
  return 0;
}
