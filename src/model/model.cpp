#include "model/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include "model/forward.h"
#include "util/error.h"
#include "util/memory.h"
#include "util/progress.h"

namespace ms {

Model::Model(TensorStore store, ModelConfig cfg, std::unique_ptr<ExpertStore> experts, MemoryPlan plan,
             int kv_positions, int prefill_chunk)
    : store_(std::move(store)),
      cfg_(std::move(cfg)),
      experts_(std::move(experts)),
      plan_(plan),
      kv_positions_(kv_positions),
      prefill_chunk_(prefill_chunk) {
  w_ = load_weights(cfg_, store_, experts_.get());
}

std::unique_ptr<Model> Model::open(const std::string& dir, const ModelOptions& opt) {
  check_prefill_chunk(opt.prefill_chunk);
  ModelConfig cfg = load_config(dir);
  check_kv_format(opt.kv, cfg.head_dim);  // before any weight is read
  if (!is_engine_dir(dir)) {
    std::unique_ptr<Model> m(new Model(TensorStore::open(dir), std::move(cfg), nullptr, {}, opt.context, opt.prefill_chunk));
    m->kv_format_ = opt.kv;
    if (opt.device == Device::Cpu && opt.memory_budget > 0)
      m->plan_ = plan_checkpoint(dir, m->cfg_, m->w_.dense_bytes + m->w_.expert_bytes, opt.memory_budget, opt,
                                 "memory budget");
    return m;
  }
  EngineIndex index = read_engine_index(dir, cfg);
  const std::string dense_path = dir + "/" + kEngineDenseFile;
  // The plan first: a budget that cannot hold the model is refused before any weight is read.
  std::error_code ec;
  const uintmax_t dense_bytes = std::filesystem::file_size(dense_path, ec);
  if (ec) fail("{}: the engine directory's dense weights cannot be read: {}", dense_path, ec.message());
  MemoryPlan plan;
  const StoreOptions store_opt = host_store_options(dir, cfg, index, dense_bytes, opt, plan);
  if (plan.context && plan.context < opt.context)
    fmt::print(stderr,
               "moestream: note: the memory budget from {} plans KV for {} tokens (not {}) and prompts in chunks of {}: a "
               "longer sequence may take more than the budget; pass --memory or --context to choose\n",
               plan.source, plan.context, opt.context, plan.prefill_chunk);
  // On the CPU the dense weights are read into the process's memory: under a memory cap the
  // page cache would evict them and read them again, token after token. (The GPU copies them to
  // VRAM and reads the map once.)
  TensorStore dense = TensorStore::open(dense_path, opt.device == Device::Cpu ? Residence::Memory : Residence::Mapped);
  if (opt.experts.verify) check_dense(dir, *dense.files().front(), index);  // expert records: as they are read
  auto experts = std::make_unique<ExpertStore>(dir, index, store_opt);
  // A default budget may have planned a shorter context or prefill chunk than asked (fit_to_budget).
  const int context = plan.context ? plan.context : opt.context;
  const int chunk = plan.prefill_chunk ? plan.prefill_chunk : opt.prefill_chunk;
  // On Cuda `plan` is the host tier's; the executor plans the VRAM.
  const MemoryPlan device_plan = opt.device == Device::Cuda ? MemoryPlan{} : plan;
  std::unique_ptr<Model> m(new Model(std::move(dense), std::move(cfg), std::move(experts), device_plan, context, chunk));
  m->host_plan_ = plan;
  m->kv_format_ = opt.kv;
  m->prepare_pools(dir, opt);
  return m;
}

uint64_t Model::kv_bytes_per_position(const KvFormat* f) const {
  int layers = has_mtp() ? 1 : 0;
  for (auto t : cfg_.layer_types) layers += t == LayerType::FullAttention;
  return uint64_t(layers) * (f ? *f : kv_format_).bytes_per_position(cfg_.n_kv_heads, cfg_.head_dim);
}

namespace {

// Each pool's share that warm start fills: `fraction` of the slots routing may use, less, when
// pinning, a token's experts (ExpertStore::pin keeps those free).
int warm_slots(int free_capacity, double fraction, int top_k, bool pin) {
  int n = int(fraction * free_capacity);
  if (pin) n = std::min(n, free_capacity - top_k);
  return std::max(0, n);
}

}  // namespace

std::vector<std::vector<int>> Model::warm_set(const std::function<int(int layer)>& free_capacity,
                                              const ModelOptions& opt) const {
  const size_t layers = experts_ ? experts_->index().layers.size() : 0;
  std::vector<std::vector<int>> hot(layers);
  if (opt.warm_start == WarmStart::Off || usage_base_.empty()) return hot;
  const bool pin = opt.warm_start == WarmStart::Pin;
  for (size_t l = 0; l < layers; ++l)
    hot[l] = usage_base_.hottest(l, warm_slots(free_capacity(int(l)), opt.warm_fraction, cfg_.top_k, pin));
  return hot;
}

void Model::check_dense(const std::string& dir, const SafetensorsFile& dense, const EngineIndex& index) {
  if (index.version >= 2) return verify_dense(dense, index);
  fmt::print(stderr,
             "moestream: note: {} is engine format version {}: its dense weights carry no checksums and are not checked "
             "(convert the checkpoint again for version {})\n",
             dir, index.version, kEngineFormatVersion);
}

void Model::prepare_pools(const std::string& dir, const ModelOptions& opt) {
  read_usage_history(dir, opt);
  warm_.profile = opt.pool_profile;
  warm_.mode = opt.warm_start;
  const auto start = std::chrono::steady_clock::now();
  if (experts_->caches()) {  // not staging only (the GPU's host tier without --host-cache)
    if (!(opt.load_whole && load_whole(opt)) && opt.warm_start != WarmStart::Off && !usage_base_.empty())
      warm_from_usage(opt);
  }
  warm_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  experts_->reset_stats();  // the load's reads are not the run's misses
}

void Model::read_usage_history(const std::string& dir, const ModelOptions& opt) {
  const EngineIndex& index = experts_->index();
  usage_base_ = empty_usage(index);
  if (opt.usage == "off") return;
  const UsageFiles files = usage_files(dir, index, opt.usage);
  warm_.usage_path = files.write;
  if (!files.note.empty()) fmt::print(stderr, "moestream: note: {}\n", files.note);
  std::string warning;
  if (auto h = read_usage(files.read, index, &warning)) usage_base_ = std::move(*h);
  if (warning.empty()) return;
  warm_.note = warning;
  fmt::print(stderr, "moestream: warning: {}\n", warning);
}

bool Model::load_whole(const ModelOptions& opt) {
  ExpertStore& s = *experts_;
  if (!s.holds_everything()) return false;
  size_t slot_bytes = 0, read_bytes = 0;  // the pools' memory; the records they read
  for (const ExpertLayer& l : s.index().layers) {
    slot_bytes += size_t(l.n_experts) * l.stride;
    read_bytes += size_t(l.n_experts) * l.record_bytes;
  }
  // Pools a budget sized hold their memory already; unsized ones take it as they fill.
  if (const uint64_t avail = available_memory(); !opt.experts.prefault && slot_bytes > avail / 10 * 9) {
    warm_.note = fmt::format("not loaded whole: the experts ({:.1f} GiB) need more than 90 % of the memory available "
                             "({:.1f} GiB); they are read as routed",
                             double(slot_bytes) / (1 << 30), double(avail) / (1 << 30));
    return false;
  }
  warm_.bytes = read_bytes;
  Progress progress(read_bytes, opt.progress);
  s.load_all([&](size_t bytes) { progress.add(bytes); });
  progress.finish();
  warm_.loaded_whole = true;
  return true;
}

void Model::warm_from_usage(const ModelOptions& opt) {
  ExpertStore& s = *experts_;
  const EngineIndex& index = s.index();
  const bool pin = opt.warm_start == WarmStart::Pin;
  const std::vector<std::vector<int>> hot = warm_set([&](int l) { return s.free_capacity(l); }, opt);
  size_t bytes = 0;
  for (size_t l = 0; l < index.layers.size(); ++l) bytes += hot[l].size() * index.layers[l].record_bytes;
  warm_.bytes = bytes;
  Progress progress(bytes, opt.progress);
  for (size_t l = 0; l < index.layers.size(); ++l) {
    if (hot[l].empty()) continue;
    if (pin) {
      s.pin(int(l), hot[l]);
      warm_.pinned += int(hot[l].size());
    } else {
      s.acquire(int(l), hot[l]);  // the layer's reads in flight together
      s.release(int(l));
    }
    warm_.warmed += int(hot[l].size());
    progress.add(hot[l].size() * index.layers[l].record_bytes);
  }
  progress.finish();
}

const char* warm_start_name(WarmStart w) { return w == WarmStart::Pin ? "pin" : w == WarmStart::Auto ? "auto" : "off"; }

std::string describe(const WarmReport& w) {
  std::string s = "pools at load: ";
  if (w.loaded_whole) s += fmt::format("every expert read ({:.1f} s)", w.seconds);
  else if (w.warmed > 0)
    s += fmt::format("warm start {} read {} hot experts ({} pinned) in {:.1f} s", warm_start_name(w.mode), w.warmed, w.pinned,
                     w.seconds);
  else s += fmt::format("empty (warm start {}{})", warm_start_name(w.mode),
                        w.mode != WarmStart::Off && !w.usage_path.empty() ? ", no usage recorded yet" : "");
  s += fmt::format("; usage history {}; pool profile {}", w.usage_path.empty() ? "off" : w.usage_path,
                   w.profile.empty() ? "none" : w.profile);
  if (!w.note.empty()) s += "; " + w.note;
  return s;
}

void Model::save_usage() const {
  if (!experts_ || warm_.usage_path.empty()) return;
  const UsageHistory run = experts_->usage();
  if (run.empty()) return;
  UsageHistory h = usage_base_;
  h.merge(run);
  write_usage(warm_.usage_path, h);
}

void Model::attach(std::unique_ptr<Executor> executor) { executor_ = std::move(executor); }

void Model::check_ids(const int* ids, int T) const { check_token_ids(cfg_, ids, T); }

int Model::next_chunk(int remaining) const {
  if (remaining <= prefill_chunk_) return remaining;
  return remaining - prefill_chunk_ == 1 ? prefill_chunk_ - kPrefillChunkAlign : prefill_chunk_;
}

namespace {

template <class T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// A chunk's result after those of the chunks before it: rows appended, the last's logits and token.
void join_chunk(ForwardResult& all, ForwardResult&& chunk, bool all_logits) {
  if (all_logits) append(all.logits, chunk.logits);
  else all.logits = std::move(chunk.logits);
  all.token = chunk.token;
  append(all.hidden_pre_norm, chunk.hidden_pre_norm);
  append(all.hidden_post_norm, chunk.hidden_post_norm);
  all.routes.resize(chunk.routes.size());
  all.router_probs.resize(chunk.router_probs.size());
  for (size_t l = 0; l < chunk.routes.size(); ++l) append(all.routes[l], chunk.routes[l]);
  for (size_t l = 0; l < chunk.router_probs.size(); ++l) append(all.router_probs[l], chunk.router_probs[l]);
}

}  // namespace

ForwardResult Model::forward(const int* ids, int T, State& state, const ForwardOptions& opt) const {
  if (T <= 0) fail("forward needs at least one token");
  check_ids(ids, T);  // all of them before a chunk changes the state
  if (opt.verify && T > prefill_chunk_)
    fail("a speculative verification of {} tokens is longer than a prefill chunk ({})", T, prefill_chunk_);
  ForwardResult all;
  for (int done = 0; done < T;) {
    const int n = next_chunk(T - done);
    ForwardOptions o = opt;
    if (done + n < T) {  // only the last chunk's logits are asked for, unless every row's are
      o.pick = nullptr;
      o.logits = opt.all_logits;
    }
    ForwardResult r = executor_->forward(ids + done, n, state, o);
    state.advance(n);
    if (n == T) return r;
    join_chunk(all, std::move(r), opt.all_logits);
    done += n;
  }
  return all;
}

int Model::decode(State& state, int first, int max_steps, const DecodeOptions& opt, const OnStep& on_step) const {
  check_ids(&first, 1);
  if (!opt.pick) fail("decode needs a pick (DecodeOptions::pick)");
  if (max_steps <= 0) return 0;
  return executor_->decode(state, first, max_steps, opt, on_step);
}

std::vector<float> Model::mtp_forward(const float* hidden, const int* next_ids, int T, int pos0, State& state,
                                      std::vector<float>* hidden_out, int logit_rows) const {
  if (!w_.mtp) fail("this model has no MTP head (no mtp.* tensors)");
  if (T <= 0) fail("mtp_forward needs at least one row");
  // In chunks as forward's prompts: the head is one full-attention layer, whose rows do not
  // depend on the chunk they run in.
  if (logit_rows < 0 || logit_rows > T) logit_rows = T;
  std::vector<float> logits, h;
  if (hidden_out) hidden_out->clear();
  for (int done = 0; done < T;) {
    const int n = next_chunk(T - done);
    const int rows = std::clamp(done + n - (T - logit_rows), 0, n);  // of the last logit_rows, in this chunk
    append(logits, executor_->mtp(hidden + size_t(done) * size_t(cfg_.hidden), next_ids + done, n, pos0 + done, state,
                                  hidden_out ? &h : nullptr, rows));
    if (hidden_out) append(*hidden_out, h);
    done += n;
  }
  return logits;
}

}  // namespace ms
