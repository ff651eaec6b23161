#include "model/backend_cuda.h"

#if MOESTREAM_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "model/blocks.h"
#include "util/error.h"

namespace ms {

namespace {
// Freed buffers of up to kReusedMaxBytes, by size, for the next device_alloc of that size: a
// decode step takes and frees the same few dozen activation sizes in every layer, and
// cudaMallocAsync with cudaFreeAsync costs about 1.2 us of host time a pair (H200 host), where a
// decode step is bound by the host's launches. Reuse is stream-ordered as cudaFreeAsync's is:
// every user of these buffers works on the compute stream. Larger buffers (prefill's) go back
// to the pool, which can serve other sizes from them, and so do buffers past kReusedTotalBytes
// held (prompts of many lengths leave many sizes; a decode step's all fit in a few MB).
constexpr size_t kReusedMaxBytes = size_t(1) << 20, kReusedTotalBytes = size_t(64) << 20;

struct FreeBuffers {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> by_size;
  size_t bytes = 0;  // held in by_size
};

FreeBuffers& free_buffers() {
  static FreeBuffers* f = new FreeBuffers;  // never destroyed: buffers may be freed at exit
  return *f;
}

thread_local DeviceArena* t_arena = nullptr;  // the open ArenaScope's

// A freed buffer of `bytes` from free lists by size, or null when there is none.
void* pop_free(std::unordered_map<size_t, std::vector<void*>>& by_size, size_t bytes) {
  std::vector<void*>& v = by_size[bytes];
  if (v.empty()) return nullptr;
  void* p = v.back();
  v.pop_back();
  return p;
}
}  // namespace

DeviceArena::~DeviceArena() {
  for (void* p : mine_) cudaFree(p);  // no throwing from a destructor
}

void* DeviceArena::take(size_t bytes) {
  void* p = pop_free(free_, bytes);
  if (!p) {
    CUDA_CHECK(cudaMalloc(&p, bytes));
    mine_.insert(p);
  }
  ++lent_;
  return p;
}

bool DeviceArena::give(void* p, size_t bytes) {
  if (!mine_.count(p)) return false;
  free_[bytes].push_back(p);
  --lent_;
  return true;
}

ArenaScope::ArenaScope(DeviceArena& arena) : outer_(std::exchange(t_arena, &arena)) {}
ArenaScope::~ArenaScope() { t_arena = outer_; }

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (t_arena) return t_arena->take(bytes);
  if (bytes <= kReusedMaxBytes) {
    FreeBuffers& f = free_buffers();
    std::lock_guard<std::mutex> lock(f.mu);
    if (void* p = pop_free(f.by_size, bytes)) {
      f.bytes -= bytes;
      return p;
    }
  }
  static const bool pool_kept = [] {
    // Keep freed blocks in the default pool instead of returning them at every synchronisation:
    // a forward frees and takes the same sizes again.
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    return true;
  }();
  (void)pool_kept;
  void* p = nullptr;
  CUDA_CHECK(cudaMallocAsync(&p, bytes, cuda::compute_stream()));
  return p;
}

void device_free(void* p, size_t bytes) {
  if (!p || (t_arena && t_arena->give(p, bytes))) return;
  if (bytes <= kReusedMaxBytes) {
    FreeBuffers& f = free_buffers();
    std::lock_guard<std::mutex> lock(f.mu);
    if (f.bytes + bytes <= kReusedTotalBytes) {
      f.by_size[bytes].push_back(p);
      f.bytes += bytes;
      return;
    }
  }
  cudaFreeAsync(p, cuda::compute_stream());  // no throwing from destructors; a fault shows at the next check
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

void copy_to_device_async(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda::compute_stream()));
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::compute_stream()));
}

void zero_on_device(void* dst, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cuda::compute_stream()));
}

void DeviceKV::reserve(int n) {
  const size_t per_pos = size_t(n_kv) * size_t(head_dim);
  const int have = int(k.size() / std::max<size_t>(1, per_pos));
  if (n <= have) return;
  const size_t cap = size_t(kv_capacity(n, have, planned));
  for (DeviceArray<float>* a : {&k, &v}) {
    DeviceArray<float> grown(cap * per_pos);
    copy_on_device(grown.data(), a->data(), a->size() * sizeof(float));
    *a = std::move(grown);
  }
}

namespace {
DeviceArray<float> zeros(size_t n) {
  DeviceArray<float> a(n);
  zero_on_device(a.data(), n * sizeof(float));
  return a;
}
}  // namespace

DeviceState::DeviceState(const ModelConfig& cfg, int planned_positions)
    : kv(size_t(cfg.n_layers)), linear(size_t(cfg.n_layers)), top_k(cfg.top_k), n_experts(cfg.n_experts) {
  const int conv_dim = 2 * cfg.lin_k_heads * cfg.lin_k_dim + cfg.lin_v_heads * cfg.lin_v_dim;
  for (int l = 0; l < cfg.n_layers; ++l) {
    if (cfg.layer_types[size_t(l)] == LayerType::FullAttention) {
      kv[size_t(l)].n_kv = cfg.n_kv_heads;
      kv[size_t(l)].head_dim = cfg.head_dim;
      kv[size_t(l)].planned = planned_positions;
    } else {
      linear[size_t(l)].conv = zeros(size_t(conv_dim) * size_t(cfg.conv_kernel - 1));
      linear[size_t(l)].recurrent = zeros(size_t(cfg.lin_v_heads) * size_t(cfg.lin_k_dim) * size_t(cfg.lin_v_dim));
    }
  }
  mtp_kv.n_kv = cfg.n_kv_heads;
  mtp_kv.head_dim = cfg.head_dim;
  mtp_kv.planned = planned_positions;
  if (cfg.n_experts > 0) {  // a layer more than the decoder's: the MTP head's
    route_ids = DeviceArray<int>(size_t(cfg.n_layers + 1) * size_t(cfg.top_k));
    route_probs = DeviceArray<float>(size_t(cfg.n_layers + 1) * size_t(cfg.n_experts));
  }
}

void download_linear(const DeviceState& d, std::vector<LinearState>& host) {
  for (size_t l = 0; l < host.size(); ++l) {
    copy_to_host(host[l].conv.data(), d.linear[l].conv.data(), host[l].conv.size() * sizeof(float));
    copy_to_host(host[l].recurrent.data(), d.linear[l].recurrent.data(), host[l].recurrent.size() * sizeof(float));
  }
}

void upload_linear(DeviceState& d, const std::vector<LinearState>& host) {
  for (size_t l = 0; l < host.size(); ++l) {
    copy_to_device(d.linear[l].conv.data(), host[l].conv.data(), host[l].conv.size() * sizeof(float));
    copy_to_device(d.linear[l].recurrent.data(), host[l].recurrent.data(), host[l].recurrent.size() * sizeof(float));
  }
}

DeviceWeights::DeviceWeights(const ModelWeights& w) {
  auto add_mlp = [&](const MlpWeights& m, const char* what) {
    add(m.gate, what);
    add(m.up, what);
    add(m.down, what);
  };
  auto add_layer = [&](const LayerWeights& l) {
    add(l.input_norm);
    add(l.post_attention_norm);
    if (l.type == LayerType::FullAttention) {
      add_stack({&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj}, "attention");
      add(l.attn.o_proj, "attention");
      add(l.attn.q_norm);
      add(l.attn.k_norm);
    } else {
      add_stack({&l.linear.in_proj_qkvz, &l.linear.in_proj_ba}, "linear attention");
      add(l.linear.out_proj, "linear attention");
      for (const auto* v : {&l.linear.conv1d, &l.linear.A_log, &l.linear.dt_bias, &l.linear.norm}) add(*v);
    }
    if (!l.moe) return add_mlp(l.ffn.dense, "dense mlp");
    if (l.ffn.shared_expert.gate.data) {
      add_stack({&l.ffn.router, &l.ffn.shared_expert_gate}, "router and shared expert gate");
      add_mlp(l.ffn.shared_expert, "shared expert");
    } else {
      add(l.ffn.router, "router");
    }
    for (const MlpWeights& e : l.ffn.experts) add_mlp(e, "expert");
  };
  for (const LayerWeights& l : w.layers) add_layer(l);
  add(w.final_norm);
  add(w.lm_head, "lm_head");
  if (w.mtp) {
    add(w.mtp->fc, "mtp.fc");
    for (const auto* v : {&w.mtp->pre_fc_norm_embedding, &w.mtp->pre_fc_norm_hidden, &w.mtp->norm}) add(*v);
    add_layer(w.mtp->layer);
  }
}

namespace {
size_t row_bytes(const Mat& m) { return m.type == WeightType::BF16 ? size_t(m.cols) * 2 : m.quant().row_bytes(); }
size_t row_groups(const Mat& m) { return m.type == WeightType::Affine ? size_t(m.cols / m.group) : 0; }

// Whether parts can be one matrix of their rows on the GPU: one format and width, each part's
// rows starting 16-byte aligned (cuda::matmul's rule) and its scales 8 (its wide scale loads).
bool stackable(const std::vector<const Mat*>& parts) {
  const Mat& a = *parts[0];
  for (const Mat* m : parts) {
    if (!m->data || m->type != a.type || m->cols != a.cols || m->bits != a.bits || m->group != a.group) return false;
    if (m->type != WeightType::BF16 && m->type != WeightType::Affine) return false;
  }
  size_t rows = 0;
  for (const Mat* m : parts) {
    if (rows * row_bytes(a) % 16 != 0 || rows * row_groups(a) * 2 % 8 != 0) return false;
    rows += size_t(m->rows);
  }
  return true;
}
}  // namespace

// The parts' rows, in order, in one set of device buffers: the whole, and each part a view of it.
void DeviceWeights::upload_rows(const std::vector<const Mat*>& parts, const char* what) {
  const Mat& a = *parts[0];
  if (a.type != WeightType::BF16 && a.type != WeightType::Affine)
    fail("{} weights [{}, {}] are float32 in memory; the CUDA matmul reads bf16 or affine weights only", what, a.rows,
         a.cols);
  size_t rows = 0;
  for (const Mat* m : parts) rows += size_t(m->rows);
  auto upload = [&](size_t per_row, auto field) {
    DeviceArray<unsigned char> buf(rows * per_row);
    size_t at = 0;
    for (const Mat* m : parts) {
      copy_to_device(buf.data() + at, field(*m), size_t(m->rows) * per_row);
      at += size_t(m->rows) * per_row;
    }
    bytes_ += buf.size();
    buffers_.push_back(std::move(buf));
    return buffers_.back().data();
  };
  Mat whole = a;
  whole.rows = int(rows);
  whole.data = upload(row_bytes(a), [](const Mat& m) { return m.data; });
  if (a.type == WeightType::Affine) {
    whole.scales = reinterpret_cast<const uint16_t*>(upload(row_groups(a) * 2, [](const Mat& m) { return m.scales; }));
    whole.biases = reinterpret_cast<const uint16_t*>(upload(row_groups(a) * 2, [](const Mat& m) { return m.biases; }));
  }
  size_t row = 0;
  for (const Mat* m : parts) {
    Mat view = whole;
    view.rows = m->rows;
    view.data = static_cast<const unsigned char*>(whole.data) + row * row_bytes(a);
    if (a.type == WeightType::Affine) view.scales += row * row_groups(a), view.biases += row * row_groups(a);
    mats_.emplace(m->data, view);
    row += size_t(m->rows);
  }
  if (parts.size() > 1) {
    Stack& st = stacks_[a.data];
    st.whole = whole;
    for (const Mat* m : parts) st.parts.push_back(m->data);
  }
}

void DeviceWeights::add(const Mat& m, const char* what) {
  if (!m.data || mats_.count(m.data)) return;  // absent, or the tied lm_head
  upload_rows({&m}, what);
}

void DeviceWeights::add_stack(const std::vector<const Mat*>& parts, const char* what) {
  if (!stackable(parts) || std::any_of(parts.begin(), parts.end(), [&](const Mat* m) { return mats_.count(m->data); })) {
    for (const Mat* m : parts) add(*m, what);
    return;
  }
  upload_rows(parts, what);
}

const Mat* DeviceWeights::stacked(std::initializer_list<const Mat*> parts) const {
  auto it = stacks_.find((*parts.begin())->data);
  if (it == stacks_.end() || !std::equal(parts.begin(), parts.end(), it->second.parts.begin(), it->second.parts.end(),
                                         [](const Mat* m, const void* p) { return m->data == p; }))
    return nullptr;
  return &it->second.whole;
}

void DeviceWeights::add(const std::vector<float>& v) {
  if (v.empty()) return;
  buffers_.push_back(DeviceArray<unsigned char>::from(reinterpret_cast<const unsigned char*>(v.data()), v.size() * 4));
  bytes_ += v.size() * 4;
  vecs_.emplace(v.data(), reinterpret_cast<const float*>(buffers_.back().data()));
}

void DeviceWeights::add_embedding(const Mat& embed, uint64_t room) {
  if (has(embed) || embed.type == WeightType::F32) return;  // has: the tied lm_head
  const size_t table = size_t(embed.rows) * (row_bytes(embed) + 4 * row_groups(embed));
  if (table <= room) add(embed, "embedding");
}

const Mat& DeviceWeights::mat(const Mat& host) const {
  auto it = mats_.find(host.data);
  if (it == mats_.end()) fail("a [{}, {}] matrix the forward uses was not copied to the GPU", host.rows, host.cols);
  return it->second;
}

const float* DeviceWeights::vec(const std::vector<float>& host) const {
  auto it = vecs_.find(host.data());
  if (it == vecs_.end()) fail("a vector of {} floats the forward uses was not copied to the GPU", host.size());
  return it->second;
}

void CudaBackend::matmul_stack(const float* x, int T, std::initializer_list<const Mat*> parts, float* y) const {
  if (const Mat* whole = weights.stacked(parts); whole && T == 1) return matmul(x, 1, *whole, y);
  for (const Mat* m : parts) {
    matmul(x, T, mat(*m), y);
    y += size_t(T) * size_t(m->rows);
  }
}

bool CudaBackend::moe_on_device(const ModelConfig& cfg, const FfnWeights& w, const float* x, int T, float* out,
                                int* routes, float* router_probs) const {
  if (T != 1 || w.store_layer < 0 || !experts) return false;
  // The shared expert's buffers live past the join: taken and given back on the compute stream.
  const bool has_shared = cfg.shared_inter > 0;
  const size_t shared_inter = has_shared ? size_t(w.shared_expert.gate.rows) : 0;
  Buf shared = alloc(has_shared ? size_t(cfg.hidden) : 0), shared_h = alloc(shared_inter), shared_u = alloc(shared_inter);
  std::optional<cuda::SideStream> side;
  if (has_shared) {
    side.emplace();
    mlp_forward(*this, mlp(w.shared_expert), x, 1, shared_h.data(), shared_u.data(), shared.data());
    side->end();
  }
  const int E = cfg.n_experts, K = cfg.top_k, layer = w.store_layer;
  if ((size_t(layer) + 1) * size_t(K) > state.route_ids.size())
    fail("expert layer {} is past the {} layers of routes a forward keeps", layer, state.route_ids.size() / size_t(K));
  // The shared expert gate's logit after the router's, where its row was copied with theirs.
  const bool gate_with_router = has_shared && weights.stacked({&w.router, &w.shared_expert_gate});
  Buf logits = alloc(size_t(E) + 1), weights = alloc(size_t(K));
  int* ids = state.route_ids.data() + size_t(layer) * size_t(K);
  float* probs = state.route_probs.data() + size_t(layer) * size_t(E);
  if (gate_with_router) matmul_stack(x, 1, {&w.router, &w.shared_expert_gate}, logits.data());
  else matmul(x, 1, mat(w.router), logits.data());
  const uint8_t* const* table = experts->resident_table(layer);
  DeviceArray<const uint8_t*> records{size_t(K)};
  const std::array<ProjLayout, 3>& p = w.record_layout->proj;
  const cuda::RecordMat proj[3] = {
      {p[0].bits, p[0].group, p[0].rows, p[0].cols, p[0].q_offset, p[0].scales_offset, p[0].biases_offset},
      {p[1].bits, p[1].group, p[1].rows, p[1].cols, p[1].q_offset, p[1].scales_offset, p[1].biases_offset},
      {p[2].bits, p[2].group, p[2].rows, p[2].cols, p[2].q_offset, p[2].scales_offset, p[2].biases_offset}};
  Buf scratch = alloc(cuda::moe_scratch_floats(1, K, proj));
  const float* shared_out = gate_with_router ? shared.data() : nullptr;
  const cuda::InlineRoute route{logits.data(), E, cfg.norm_topk, probs, ids, weights.data(), table, records.data()};
  if (cuda::routes_in_gate_up(route, K, proj)) {
    // The experts' first launch routes the token itself, and the shared expert joins before the
    // second, the first to read its output: no launch stands between the router and the experts,
    // and the shared expert runs beside both.
    cuda::moe_gate_up_routed(x, K, route, proj, scratch.data());
    if (side) side->join();
    cuda::moe_down(scratch.data(), 1, K, records.data(), weights.data(), proj, out, shared_out, logits.data() + E);
  } else {
    cuda::route_topk(logits.data(), 1, E, K, cfg.norm_topk, probs, ids, weights.data(), table, records.data());
    if (!table) {
      std::vector<int> host_ids(static_cast<size_t>(K));
      copy_to_host(host_ids.data(), ids, host_ids.size() * sizeof(int));
      const std::vector<const uint8_t*> acquired = experts->acquire(layer, host_ids);
      copy_to_device(records.data(), acquired.data(), acquired.size() * sizeof(const uint8_t*));
    }
    if (side) side->join();
    cuda::moe_experts(x, 1, K, records.data(), weights.data(), proj, out, scratch.data(), shared_out, logits.data() + E);
  }
  if (has_shared && !gate_with_router) shared_gate_add(out, shared.data(), x, mat(w.shared_expert_gate), 1, cfg.hidden);
  // Slots held until the kernels are queued: the copy stream orders any refill after them.
  if (!table) experts->release(layer);
  if (routes || router_probs) pending_routes.push_back({routes, router_probs, layer});
  return true;
}

void CudaBackend::finish() const {
  if (pending_routes.empty()) return;
  const size_t K = size_t(state.top_k), E = size_t(state.n_experts);
  const std::vector<int> ids = state.route_ids.to_vector();
  const std::vector<float> probs = state.route_probs.to_vector();
  for (const PendingRoutes& p : pending_routes) {
    if (p.ids) std::copy_n(ids.data() + size_t(p.layer) * K, K, p.ids);
    if (p.probs) std::copy_n(probs.data() + size_t(p.layer) * E, E, p.probs);
  }
  pending_routes.clear();
}

CudaBackend::ExpertGroups CudaBackend::expert_groups(const std::vector<std::vector<int>>& users,
                                                     const std::vector<float>& weights, int K) const {
  std::vector<size_t> first{0};
  for (const auto& u : users) first.push_back(first.back() + u.size());
  const size_t total = first.back();
  std::vector<int> rows(2 * total);
  std::vector<float> wt(total);
  for (size_t e = 0, j = 0; e < users.size(); ++e)
    for (int u : users[e]) {
      rows[j] = u / K;
      rows[total + j] = u;
      wt[j++] = weights[size_t(u)];
    }
  return {DeviceArray<int>::from(rows.data(), rows.size()), DeviceArray<float>::from(wt.data(), wt.size()),
          std::move(first)};
}

}  // namespace ms
#endif
