#include "model/plan.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include "util/error.h"
#include "util/memory.h"

namespace ms {

namespace {

constexpr uint64_t kNoBudget = uint64_t(1) << 62;  // a budget that holds any model

uint64_t per_slot_row(const EngineIndex& index) {  // one slot in every MoE layer
  uint64_t b = 0;
  for (const auto& l : index.layers) b += l.stride;
  return b;
}

// Floats a forward keeps live per token at its peak (the buffers of model/blocks.h and
// model/moe.h): x, its norm and the layer's output beside the largest block's working set, the
// quantized matmul's permuted copy of its input (kernels/cpu/quant_matmul.cpp) and the routes a
// forward may keep. A cache that is not float32 adds the rows it encodes from and the rotated q.
uint64_t activation_floats_per_token(const ModelConfig& c, const KvFormat& kv) {
  const uint64_t H = uint64_t(c.hidden), E = uint64_t(c.n_experts), K = uint64_t(c.top_k);
  const bool gated = c.arch == Arch::Qwen3Next;
  const uint64_t q_width = uint64_t(c.n_heads) * uint64_t(c.head_dim), kv_width = uint64_t(c.n_kv_heads) * uint64_t(c.head_dim);
  // proj [q_raw, k, v], q, gate, then the normed k or the attention's output
  const uint64_t attention = (gated ? 2 : 1) * q_width + 2 * kv_width + (gated ? 2 : 1) * q_width +
                             std::max(kv_width, q_width) + (kv.exact() ? 0 : 2 * kv_width + q_width);
  const uint64_t kd = uint64_t(c.lin_k_heads) * uint64_t(c.lin_k_dim), vd = uint64_t(c.lin_v_heads) * uint64_t(c.lin_v_dim);
  const uint64_t nv = uint64_t(c.lin_v_heads), conv = 2 * kd + vd;
  // proj [qkvz, ba], q k v z g beta, then the conv's input and output (and b, a) or the rule's output
  const uint64_t deltanet = (2 * kd + 2 * vd + 2 * nv) + (2 * kd + 2 * vd + 2 * nv) + std::max(2 * conv + 2 * nv, vd);
  const uint64_t dense = 2 * uint64_t(c.dense_inter);
  // the shared expert's output and its h, u; or router logits and probabilities, the routing, the
  // per-slot partials, an expert's gathered rows, its output and its h, u
  const uint64_t shared = c.shared_inter > 0 ? H : 0;
  const uint64_t moe = E ? shared + std::max(2 * uint64_t(c.shared_inter), 2 * E + 3 * K + K * H + 2 * H + 2 * uint64_t(c.moe_inter)) : 0;
  const uint64_t widest_input = std::max({H, q_width, vd, uint64_t(c.dense_inter), uint64_t(c.moe_inter), uint64_t(c.shared_inter)});
  const uint64_t routes = uint64_t(c.n_layers) * (K + E);
  return 3 * H + std::max({attention, deltanet, dense, moe}) + widest_input + routes;
}

// Splits a budget (`what`: "memory budget", "VRAM budget"): dense weights, KV and recurrent
// state for `context` tokens, activations of a prefill chunk, with `staging` the prefetch
// staging (in the budget's memory: host RAM, or VRAM), and the rest as equal pools. A model
// without routed experts (an empty index) needs only the first three.
// Everything of plan_memory but the pools and the floor's check: the plan's fixed parts and
// its floor (*floor: the fixed parts and one token's experts in every layer).
MemoryPlan plan_fixed(const ModelConfig& cfg, const EngineIndex& index, uint64_t dense_bytes, uint64_t budget,
                      const ModelOptions& opt, bool staging, uint64_t process, uint64_t* floor) {
  const int context = opt.context;
  MemoryPlan p;
  p.context = context;
  p.prefill_chunk = opt.prefill_chunk;
  p.process = process;
  p.dense = dense_bytes;
  int full = 0;
  for (auto t : cfg.layer_types) full += t == LayerType::FullAttention;
  const uint64_t kv_per_token = uint64_t(full + 1) * opt.kv.bytes_per_position(cfg.n_kv_heads, cfg.head_dim);
  const uint64_t linear = uint64_t(cfg.n_layers - full) *
                          (uint64_t(cfg.lin_v_heads) * cfg.lin_k_dim * cfg.lin_v_dim +
                           uint64_t(2 * cfg.lin_k_heads * cfg.lin_k_dim + cfg.lin_v_heads * cfg.lin_v_dim) * 4) * sizeof(float);
  // Speculative verification keeps a copy of those states after each drafted token (State::begin_steps).
  p.kv = kv_per_token * uint64_t(context) + linear * (opt.speculative.mtp || opt.speculative.automatic ? 1 + kMaxDraft : 1);
  // A prefill chunk's activations (Model::next_chunk keeps every forward within one; a context
  // shorter than a chunk holds no longer prompt) and the last position's logits.
  const uint64_t chunk = uint64_t(std::min(opt.prefill_chunk, context));
  p.activations = (chunk * activation_floats_per_token(cfg, opt.kv) + uint64_t(cfg.vocab)) * sizeof(float);
  const uint64_t per_slot = per_slot_row(index);
  // Staging where prefetch will run: always with On; with Auto where the pools stream, which
  // they do unless the budget holds every expert beside the staging too.
  if (const PrefetchOptions& pf = opt.experts.prefetch; staging && pf.mode != PrefetchMode::Off && per_slot > 0) {
    const uint64_t all = p.fixed() + per_slot * uint64_t(cfg.n_experts);
    if (pf.mode == PrefetchMode::On || budget < all) {
      const uint64_t widest = index.widest_stride();
      p.staging_buffers = staging_buffers(pf, cfg.top_k);
      // Unasked, staging takes at most a quarter of what the dense weights, KV and activations
      // leave: a tight budget's pools matter more than a deep prefetch.
      if (pf.staging == 0 && budget > p.fixed())
        p.staging_buffers = int(std::clamp<uint64_t>((budget - p.fixed()) / 4 / widest, 1, uint64_t(p.staging_buffers)));
      p.staging = uint64_t(p.staging_buffers) * widest;
    }
  }
  *floor = p.fixed() + per_slot * uint64_t(cfg.top_k);
  return p;
}

MemoryPlan plan_memory(const ModelConfig& cfg, const EngineIndex& index, uint64_t dense_bytes, uint64_t budget,
                       const ModelOptions& opt, const char* what, bool staging = false, uint64_t process = 0) {
  uint64_t floor = 0;
  MemoryPlan p = plan_fixed(cfg, index, dense_bytes, budget, opt, staging, process, &floor);
  const uint64_t per_slot = per_slot_row(index);
  if (budget < floor) {
    const std::string pools =
        per_slot ? fmt::format(", and {} expert slots per layer x {} layers ({} per slot row)", cfg.top_k,
                               index.layers.size(), format_bytes(per_slot))
                 : std::string();
    const std::string staging = p.staging ? fmt::format(", prefetch staging {} (--prefetch-staging)", format_bytes(p.staging)) : std::string();
    const std::string process = p.process ? fmt::format("the process {}, ", format_bytes(p.process)) : std::string();
    fail("{} {} is below the floor of {}: {}dense weights {}, KV/state for {} tokens {}, activations {}{}{}", what,
         format_bytes(budget), format_bytes(floor), process, format_bytes(p.dense), p.context, format_bytes(p.kv),
         format_bytes(p.activations), staging, pools);
  }
  if (per_slot == 0) return p;
  p.slots = int(std::min<uint64_t>((budget - p.fixed()) / per_slot, uint64_t(cfg.n_experts)));
  p.pool = per_slot * uint64_t(p.slots);
  return p;
}

void check_floor(const std::string& dir, const StoreOptions& o, const EngineIndex& index, int top_k, const char* where) {
  for (const auto& l : index.layers)
    if (const int cap = layer_capacity(o, l); cap < top_k)
      fail("{}: {} {}expert slots for layer {} cannot hold one token's {} routed experts", dir, cap, where, l.name, top_k);
}

// --host-cache auto: the bytes of expert records (and prefetch staging) that fit in what the
// process may use (ModelOptions::host_budget, else default_host_budget: the cgroup's limit or
// MemAvailable, less their margins) beside its own reserve: every expert where they all fit, 0
// (staging only) where one token's experts in every layer do not. `plan` records the budget.
uint64_t auto_host_cache(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index, const ModelOptions& opt,
                         MemoryPlan& plan) {
  // The CUDA runtime's and the libraries' host memory (context, cuBLAS, pinned staging of their
  // own) is charged to the same limit and is no part of the plan: a reserve for it.
  constexpr uint64_t kCudaHostReserve = uint64_t(1) << 30;
  const HostBudget limit = opt.host_budget ? *opt.host_budget : default_host_budget();
  plan.budget = limit.bytes;
  plan.source = limit.source;
  plan.process = process_reserve(dir) + kCudaHostReserve;
  const uint64_t row = per_slot_row(index), all = row * uint64_t(cfg.n_experts);
  const uint64_t room = limit.bytes > plan.process ? limit.bytes - plan.process : 0;
  if (const uint64_t whole = all + staging_bytes(opt.experts.prefetch, cfg, index, cfg.n_experts); room >= whole) return whole;
  const uint64_t staging = staging_bytes(opt.experts.prefetch, cfg, index, 0);
  return room >= staging + row * uint64_t(cfg.top_k) ? room : 0;
}

// The host tier under the VRAM pool: a cache of `host_cache` bytes (equal slots per layer; auto:
// auto_host_cache), or staging slots for one token's experts that keep nothing. `plan` gets the
// tier's share: its pool, staging, slots and (auto) the budget they came from.
StoreOptions host_tier_options(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index,
                               const ModelOptions& opt, MemoryPlan& plan) {
  if (!opt.host_cache_auto && opt.host_cache > 0) check_under_cgroup_limit(opt.host_cache, "--host-cache");
  const uint64_t host_cache = opt.host_cache_auto ? auto_host_cache(dir, cfg, index, opt, plan) : opt.host_cache;
  StoreOptions h;
  h.io = opt.experts.io;
  h.direct_io = opt.experts.direct_io;
  h.verify = opt.experts.verify;
  h.top_k = cfg.top_k;
  h.policy = opt.host_policy;
  h.slots = cfg.top_k;
  h.cache = host_cache > 0;
  h.prefetch = opt.experts.prefetch;
  h.prefault = true;  // staging for one token, or the --host-cache budget
  if (h.cache) {
    const uint64_t row = per_slot_row(index);
    // Prefetch staging comes out of the host cache (Auto: where it cannot hold every expert).
    const uint64_t staging = staging_bytes(h.prefetch, cfg, index, int(std::min<uint64_t>(host_cache / row, uint64_t(cfg.n_experts))));
    if (host_cache < staging + row * uint64_t(cfg.top_k))
      fail("{}: --host-cache {} cannot hold one token's {} experts in every layer ({} per slot row){}", dir,
           format_bytes(host_cache), cfg.top_k, format_bytes(row),
           staging ? fmt::format(" beside the prefetch staging ({})", format_bytes(staging)) : std::string());
    h.slots = int(std::min<uint64_t>((host_cache - staging) / row, uint64_t(cfg.n_experts)));
    plan.slots = h.slots;
    plan.pool = row * uint64_t(h.slots);
    plan.staging = staging;
  }
  return h;
}

}  // namespace

std::string describe(const MemoryPlan& p, Device device) {
  if (p.slots == 0 && p.budget == 0) return {};
  auto mib = [](uint64_t b) { return double(b) / (1 << 20); };
  const std::string process = p.process ? fmt::format("process {:.1f} MiB, ", mib(p.process)) : std::string();
  const std::string tokens = p.context ? fmt::format(" ({} tokens)", p.context) : std::string();
  const std::string chunk = p.prefill_chunk ? fmt::format(" (chunks of {})", p.prefill_chunk) : std::string();
  const std::string parts = fmt::format("{}dense {:.1f} MiB, KV/state {:.1f} MiB{}, activations {:.1f} MiB{}, prefetch "
                                        "staging {:.1f} MiB, pools {:.1f} MiB",
                                        process, mib(p.dense), mib(p.kv), tokens, mib(p.activations), chunk, mib(p.staging),
                                        mib(p.pool));
  const std::string from = p.source.empty() ? std::string() : fmt::format(" {} from {}", format_bytes(p.budget), p.source);
  const char* what = device == Device::Cuda ? "VRAM budget" : "memory budget";
  if (p.slots == 0)  // a budget that sized nothing: everything fits in it
    return fmt::format("{}{} (every expert fits: nothing sized by it): {}", what, from, parts);
  return fmt::format("{}{}: {} ({} slots a layer)", what, from, parts, p.slots);
}

std::string describe_host_tier(const MemoryPlan& p) {
  const std::string from = p.source.empty() ? std::string() : fmt::format(" (--host-cache auto: {} from {})",
                                                                          format_bytes(p.budget), p.source);
  if (p.slots == 0) return "host tier: staging for one token only" + (from.empty() ? std::string(" (--host-cache 0)") : from);
  return fmt::format("host tier: {} of expert records, {} slots a layer, prefetch staging {}{}", format_bytes(p.pool), p.slots,
                     format_bytes(p.staging), from);
}

uint64_t process_reserve(const std::string& dir) {
  // Measured on pycoder-moe-q4 under a cgroup cap: ~1.2 MiB of anonymous memory outside the plan,
  // and up to ~3 MiB of the binary's code pages charged to the cap after a global cache drop.
  constexpr uint64_t kFixed = uint64_t(4) << 20;
  std::error_code ec;
  const uintmax_t tokenizer = std::filesystem::file_size(std::filesystem::path(dir) / "tokenizer.json", ec);
  return kFixed + (ec ? 0 : uint64_t(tokenizer));
}

uint64_t staging_bytes(const PrefetchOptions& p, const ModelConfig& cfg, const EngineIndex& index, int slots) {
  if (p.mode == PrefetchMode::Off || index.layers.empty()) return 0;
  if (p.mode == PrefetchMode::Auto && slots >= cfg.n_experts) return 0;
  return uint64_t(staging_buffers(p, cfg.top_k)) * index.widest_stride();
}

// A chunk the DeltaNet kernels split as a whole prefill does, with room to move one alignment back.
void check_prefill_chunk(int chunk) {
  if (chunk < 2 * kPrefillChunkAlign || chunk % kPrefillChunkAlign != 0)
    fail("prefill chunk {} must be a multiple of {} and at least {}", chunk, kPrefillChunkAlign, 2 * kPrefillChunkAlign);
}

namespace {

// Bytes the pools take where no budget sizes them: every expert, or the slots or caps asked for.
uint64_t unsized_pool_bytes(const EngineIndex& index, const StoreOptions& o) {
  uint64_t b = 0;
  for (const auto& l : index.layers) b += uint64_t(layer_capacity(o, l)) * l.stride;
  return b;
}

// Where a budget nobody named (the cgroup's, MemAvailable's) cannot hold the prefill chunk and
// the context planned by default, both are halved until its floor fits, down to
// kFitMinChunk-token chunks and kFitMinContext tokens; a --context the user gave is kept.
ModelOptions fit_to_budget(const ModelConfig& cfg, const EngineIndex& index, uint64_t dense_bytes, uint64_t budget,
                           ModelOptions opt, uint64_t process) {
  constexpr int kFitMinChunk = 2 * kPrefillChunkAlign, kFitMinContext = 512;
  for (;;) {
    uint64_t floor = 0;
    plan_fixed(cfg, index, dense_bytes, budget, opt, true, process, &floor);
    if (floor <= budget) return opt;
    if (opt.prefill_chunk / 2 >= kFitMinChunk && opt.prefill_chunk / 2 % kPrefillChunkAlign == 0) opt.prefill_chunk /= 2;
    else if (!opt.context_given && opt.context / 2 >= kFitMinContext) opt.context /= 2;
    else return opt;  // as small as it goes: plan_memory names the floor
  }
}

}  // namespace

MemoryPlan plan_host_memory(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index, uint64_t dense_bytes,
                            const ModelOptions& opt) {
  const uint64_t process = process_reserve(dir);
  if (opt.memory_budget > 0) {
    check_under_cgroup_limit(opt.memory_budget, "--memory");
    MemoryPlan plan = plan_memory(cfg, index, dense_bytes, opt.memory_budget, opt, "memory budget", true, process);
    plan.budget = opt.memory_budget;
    plan.source = "--memory";
    return plan;
  }
  const HostBudget limit = opt.host_budget ? *opt.host_budget : default_host_budget();
  // What the run takes unsized: the plan of a budget that holds every expert, whose pools are
  // then what the slots or caps asked for hold.
  MemoryPlan unsized = plan_memory(cfg, index, dense_bytes, kNoBudget, opt, "memory", true, process);
  unsized.pool = unsized_pool_bytes(index, opt.experts);
  unsized.slots = 0;
  unsized.budget = limit.bytes;
  unsized.source = limit.source;
  if (unsized.total() <= limit.bytes) return unsized;  // fits: nothing to size
  const bool asked = opt.experts.slots > 0 || !opt.experts.layer_caps.empty();
  if (asked)
    fail("{}: the expert pools asked for ({}: {}) and the rest ({}) need {}, more than the {} that {} leaves; ask for "
         "fewer slots{}, or for a --memory budget, which sizes them",
         dir, opt.pool_profile.empty() ? "--expert-slots" : "the pool profile " + opt.pool_profile,
         format_bytes(unsized.pool), format_bytes(unsized.fixed()), format_bytes(unsized.total()), format_bytes(limit.bytes),
         limit.source, opt.pool_profile.empty() ? "" : " (--pool-profile none drops the profile)");
  const ModelOptions fitted = fit_to_budget(cfg, index, dense_bytes, limit.bytes, opt, process);
  MemoryPlan plan;
  try {
    plan = plan_memory(cfg, index, dense_bytes, limit.bytes, fitted, "memory budget", true, process);
  } catch (const Error& e) {
    fail("{}; with no --memory the budget is {}: raise the limit, or run a smaller model", e.what(), limit.source);
  }
  plan.budget = limit.bytes;
  plan.source = limit.source;
  return plan;
}

namespace {

// A pool profile's layers must be MoE layers of this model: a cap or pin for another model's
// layer would otherwise be dropped without a word.
void check_profile_layers(const EngineIndex& index, const ModelOptions& opt) {
  std::vector<int> layers;
  for (const ExpertLayer& l : index.layers)
    if (const int m = model_layer_of(l.name); m >= 0) layers.push_back(m);
  auto check = [&](int layer, const char* field) {
    if (std::find(layers.begin(), layers.end(), layer) != layers.end()) return;
    fail("{}: {} names layer {}, which is not one of this model's {} MoE layers ({} to {})",
         opt.pool_profile.empty() ? std::string("pool profile") : opt.pool_profile, field, layer, layers.size(),
         layers.empty() ? 0 : layers.front(), layers.empty() ? 0 : layers.back());
  };
  for (const auto& [layer, cap] : opt.experts.layer_caps) check(layer, "layer_caps");
  for (const auto& [layer, experts] : opt.experts.pins) check(layer, "pins");
}

}  // namespace

StoreOptions host_store_options(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index,
                                uint64_t dense_bytes, const ModelOptions& opt, MemoryPlan& plan) {
  check_profile_layers(index, opt);
  StoreOptions store_opt = opt.experts;
  store_opt.top_k = cfg.top_k;
  if (opt.device == Device::Cuda) {
    store_opt = host_tier_options(dir, cfg, index, opt, plan);
  } else {
    plan = plan_host_memory(dir, cfg, index, dense_bytes, opt);
    if (plan.slots > 0) {
      store_opt.slots = plan.slots;
      store_opt.prefetch.staging = plan.staging_buffers;
      store_opt.prefault = true;  // the plan fits the budget: its pools are charged at start
      store_opt.layer_caps.clear();
    }
  }
  check_floor(dir, store_opt, index, cfg.top_k, opt.device == Device::Cuda ? "host " : "");
  return store_opt;
}

MemoryPlan plan_checkpoint(const std::string& dir, const ModelConfig& cfg, uint64_t weight_bytes, uint64_t budget,
                           const ModelOptions& opt, const char* what) {
  try {
    const uint64_t process = opt.device == Device::Cpu ? process_reserve(dir) : 0;
    return plan_memory(cfg, EngineIndex{}, weight_bytes, budget, opt, what, false, process);
  } catch (const Error& e) {
    fail("{}: {}; a checkpoint directory keeps every expert in memory: `moestream convert` it to stream them", dir,
         e.what());
  }
}

namespace {

// --cpu-experts N: the first N MoE layers compute every expert on the CPU, so their pools keep
// only the floor (one token's experts) and the slots they leave go to the other layers, as
// llama.cpp's --n-cpu-moe gives the VRAM to the layers it keeps.
void give_static_layers_floor(StoreOptions& vram, const EngineIndex& index, int top_k, const CpuExperts& c) {
  const int L = int(index.layers.size()), n_static = std::min(c.layers, L);
  if (n_static == 0 || n_static == L) return;
  int64_t total = 0;
  for (const ExpertLayer& l : index.layers) total += layer_capacity(vram, l);
  const int64_t rest = std::max<int64_t>(0, total - int64_t(n_static) * top_k) / (L - n_static);
  for (int i = 0; i < L; ++i) {
    const ExpertLayer& l = index.layers[size_t(i)];
    vram.layer_caps[model_layer_of(l.name)] = i < n_static ? top_k : int(std::min<int64_t>(rest, l.n_experts));
  }
}

}  // namespace

StoreOptions vram_store_options(const std::string& dir, const ModelConfig& cfg, const EngineIndex& index,
                                uint64_t dense_bytes, uint64_t free_vram, const ModelOptions& asked, MemoryPlan& plan) {
  // Under --prefetch auto the VRAM pools copy nothing ahead: on the H100 the copies ahead of the
  // router cost more than they hid (docs/PERFORMANCE.md, "VRAM prefetch"); --prefetch on asks.
  ModelOptions opt = asked;
  if (opt.experts.prefetch.mode == PrefetchMode::Auto) opt.experts.prefetch.mode = PrefetchMode::Off;
  StoreOptions vram = opt.experts;
  vram.top_k = cfg.top_k;
  // VRAM staging for predicted experts comes out of the budget where the pools stream; pools
  // sized by --expert-slots or a profile take it beside them.
  vram.prefetch.staging = 0;
  if (opt.vram_budget) {
    plan = plan_memory(cfg, index, dense_bytes, opt.vram_budget, opt, "VRAM budget", true);
    vram.slots = plan.slots;
    vram.layer_caps.clear();
    vram.prefetch.staging = plan.staging_buffers;
  } else if (vram.slots == 0 && vram.layer_caps.empty()) {
    const MemoryPlan p = plan_memory(cfg, index, dense_bytes, dense_bytes + free_vram, opt, "free VRAM", true);
    if (p.slots < cfg.n_experts) plan = p, vram.slots = p.slots, vram.prefetch.staging = p.staging_buffers;
  } else if (opt.experts.prefetch.mode != PrefetchMode::Off) {
    vram.prefetch.staging = staging_buffers(opt.experts.prefetch, cfg.top_k);
  }
  if (opt.cpu_experts.mode == CpuExperts::Mode::Layers) give_static_layers_floor(vram, index, cfg.top_k, opt.cpu_experts);
  check_floor(dir, vram, index, cfg.top_k, "VRAM ");
  return vram;
}

}  // namespace ms
