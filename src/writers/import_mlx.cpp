#include "writers/import_mlx.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "format/config.h"
#include "format/engine_dir.h"
#include "format/safetensors.h"
#include "util/error.h"
#include "util/half.h"
#include "util/json.h"
#include "writers/convert_parts.h"
#include "writers/engine_writer.h"

namespace ms {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kSwitch = ".switch_mlp.";

// Where a module's quantization comes from: config.json's `quantization`, whose top-level
// group_size/bits apply to every quantized module unless the module's own path has an entry
// ({group_size, bits}, or false: left unquantized).
struct MlxQuant {
  int bits = 0, group = 0;  // 0: not quantized
};

class MlxQuantConfig {
 public:
  explicit MlxQuantConfig(const std::string& config_path) : file_(config_path) {
    const json j = parse_json_file(config_path, {.reject_duplicate_keys = true});
    const char* key = j.contains("quantization") ? "quantization" : "quantization_config";
    if (!j.contains(key) || !j[key].is_object())
      fail("{}: no 'quantization' object: this is not an mlx-lm quantized checkpoint (an unquantized MLX export "
           "is a Hugging Face checkpoint: convert it with --from as such)",
           config_path);
    const json& q = j[key];
    if (q.contains("mode") && q["mode"] != "affine")
      fail("{}: quantization.mode '{}' is not supported: only mlx's affine quantization imports exactly",
           config_path, q["mode"].dump());
    default_ = params(q, "quantization");
    for (auto& [path, v] : q.items()) {
      if (v.is_boolean()) overrides_[path] = v.get<bool>() ? default_ : MlxQuant{};
      else if (v.is_object()) overrides_[path] = params(v, "quantization." + path);
    }
  }

  // The quantization of module `path` ("model.layers.0.mlp.gate").
  MlxQuant of(const std::string& path) const {
    auto it = overrides_.find(path);
    return it == overrides_.end() ? default_ : it->second;
  }
  int default_bits() const { return default_.bits; }
  int default_group() const { return default_.group; }
  const std::string& file() const { return file_; }

 private:
  MlxQuant params(const json& o, const std::string& where) const {
    if (o.contains("mode") && o["mode"] != "affine")
      fail("{}: {}.mode '{}' is not supported: only affine quantization imports exactly", file_, where, o["mode"].dump());
    for (const char* k : {"bits", "group_size"})
      if (!o.contains(k) || !o[k].is_number_integer()) fail("{}: {}.{} is missing or not an integer", file_, where, k);
    const MlxQuant m{o["bits"].get<int>(), o["group_size"].get<int>()};
    if (m.bits != 2 && m.bits != 3 && m.bits != 4 && m.bits != 5 && m.bits != 6 && m.bits != 8)
      fail("{}: {}.bits {} is not one the engine runs (2, 3, 4, 5, 6, 8)", file_, where, m.bits);
    if (m.group != 32 && m.group != 64 && m.group != 128)
      fail("{}: {}.group_size {} is not one the engine runs (32, 64, 128)", file_, where, m.group);
    return m;
  }

  std::string file_;
  MlxQuant default_;
  std::map<std::string, MlxQuant> overrides_;
};

// A quantized module's three tensors, checked against the matrix shape [rows, cols] (with a
// leading expert dimension when stacked) that config.json implies.
struct QuantTensors {
  const TensorView *q, *scales, *biases;
  int bits, group;
  ScaleType scale_type = ScaleType::BF16;  // bf16, or f16 for a float16 model
};

QuantTensors quant_tensors(const TensorStore& store, const MlxQuantConfig& qc, const std::string& module,
                           std::vector<int64_t> lead, int64_t rows, int64_t cols) {
  const MlxQuant m = qc.of(module);
  const TensorView& w = store.get(module + ".weight");
  if (m.bits == 0 || !store.has(module + ".scales"))
    fail("{}: tensor '{}.weight' is stored quantized (U32) but {} does not quantize module '{}'", w.file, module,
         qc.file(), module);
  const TensorView& s = store.get(module + ".scales");
  const TensorView& b = store.get(module + ".biases");
  if (cols % m.group != 0)
    fail("{}: module '{}' has {} inputs, not a multiple of its group_size {}", w.file, module, cols, m.group);
  auto shape = [&](int64_t last) {
    std::vector<int64_t> v = lead;
    v.push_back(rows);
    v.push_back(last);
    return v;
  };
  w.expect(DType::U32, shape(cols * m.bits / 32));
  if (s.dtype != DType::BF16 && s.dtype != DType::F16)
    fail("{}: tensor '{}' has dtype {}, expected BF16 or F16 (the model's dtype)", s.file, s.name, dtype_name(s.dtype));
  s.expect(s.dtype, shape(cols / m.group));
  b.expect(s.dtype, shape(cols / m.group));
  return {&w, &s, &b, m.bits, m.group, s.dtype == DType::F16 ? ScaleType::F16 : ScaleType::BF16};
}

// ---- experts ----

// One MoE block's stacked experts: record layout and, per projection, the source tensors
// (scales and biases null where the projection is stored unquantized, as bf16).
struct MlxExperts {
  ExpertLayer layout;
  std::array<QuantTensors, 3> src;
};

MlxExperts plan_mlx_block(const ModelConfig& cfg, const TensorStore& store, const MlxQuantConfig& qc,
                          const std::string& block) {
  const int H = cfg.hidden, I = cfg.moe_inter, E = cfg.n_experts;
  MlxExperts out;
  std::array<ProjSpec, 3> spec;
  for (size_t p = 0; p < 3; ++p) {
    const std::string module = fmt::format("{}{}{}_proj", block, kSwitch, kExpertProjections[p]);
    const int rows = p == 2 ? H : I, cols = p == 2 ? I : H;
    const TensorView& w = store.get(module + ".weight");
    if (w.dtype == DType::U32) {
      out.src[p] = quant_tensors(store, qc, module, {E}, rows, cols);
    } else {
      if (w.dtype != DType::BF16)
        fail("{}: tensor '{}' has dtype {}; unquantized experts import as bf16 only", w.file, w.name, dtype_name(w.dtype));
      w.expect(DType::BF16, {E, rows, cols});
      out.src[p] = {&w, nullptr, nullptr, kRawBits, 0};
    }
    spec[p] = {out.src[p].bits, out.src[p].group, rows, cols, out.src[p].scale_type};
  }
  out.layout = plan_expert_layer(block, expert_file_name(block), E, spec);
  return out;
}

// Record e: each projection's slice of the stacked tensors, byte for byte.
void fill_mlx_record(const MlxExperts& x, size_t e, std::vector<uint8_t>& rec) {
  for (size_t p = 0; p < 3; ++p) {
    const ProjLayout& pl = x.layout.proj[p];
    const QuantTensors& s = x.src[p];
    auto slice = [&](const TensorView* t, size_t offset, size_t n) {
      if (t->nbytes != n * size_t(x.layout.n_experts)) fail("{}: tensor '{}' has an unexpected size", t->file, t->name);
      std::memcpy(rec.data() + offset, static_cast<const uint8_t*>(t->data) + e * n, n);
    };
    slice(s.q, pl.q_offset, pl.q_bytes);
    if (s.scales) {
      slice(s.scales, pl.scales_offset, pl.scales_bytes);
      slice(s.biases, pl.biases_offset, pl.scales_bytes);
    }
  }
}

void write_mlx_experts(const fs::path& dir, MlxExperts& x, Progress& progress) {
  write_expert_blob(
      dir, x.layout, [&](size_t e, std::vector<uint8_t>& rec, std::vector<float>&) { fill_mlx_record(x, e, rec); },
      [&](size_t) {
        size_t n = 0;
        for (auto& s : x.src) n += (s.q->nbytes + (s.scales ? s.scales->nbytes + s.biases->nbytes : 0)) / size_t(x.layout.n_experts);
        progress.add(n);
      });
  for (auto& s : x.src)
    for (const TensorView* t : {s.q, s.scales, s.biases})
      if (t) release(*t);
}

// ---- dense ----

// Qwen3-Next's zero-centred norms, which mlx-lm stores with the +1 added (models/qwen3_next.py
// sanitize): imported as w − 1 in float32, which gives back the stored w exactly where w ≥ 0.5.
constexpr const char* kPlusOneNorms[] = {".input_layernorm.weight", ".post_attention_layernorm.weight",
                                         "model.norm.weight", ".q_norm.weight", ".k_norm.weight"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class DenseKind { Copy, Quantized, PlusOneNorm, Conv1d };

struct MlxDense {
  DenseKind kind;
  const TensorView* src;
  QuantTensors quant{};
  size_t first_spec = 0;
};

// The [rows, cols] of a quantized dense matrix: rows from the tensor, cols from the codes.
std::vector<MlxDense> plan_mlx_dense(const ModelConfig& cfg, const TensorStore& store, const MlxQuantConfig& qc,
                                     std::vector<TensorSpec>* specs) {
  std::vector<MlxDense> items;
  for (const std::string& name : store.names()) {
    const TensorView& t = store.get(name);
    if (name.find(kSwitch) != std::string::npos) continue;
    if (name.find(".mlp.experts.") != std::string::npos)
      fail("{}: tensor '{}' is a per-expert tensor; an MLX checkpoint stacks experts as '.mlp.switch_mlp.'", t.file, name);
    if (ends_with(name, ".scales") || ends_with(name, ".biases")) {
      const std::string module = name.substr(0, name.size() - 7);
      if (!store.has(module + ".weight") || store.get(module + ".weight").dtype != DType::U32)
        fail("{}: tensor '{}' has no quantized '{}.weight' beside it", t.file, name, module);
      continue;
    }
    MlxDense item{DenseKind::Copy, &t};
    item.first_spec = specs->size();
    if (t.dtype == DType::U32 && ends_with(name, ".weight")) {
      const std::string module = name.substr(0, name.size() - 7);
      if (t.shape.size() != 2) fail("{}: tensor '{}' is quantized but not 2-D", t.file, name);
      const MlxQuant m = qc.of(module);
      if (m.bits == 0) fail("{}: tensor '{}' is stored quantized but {} leaves '{}' unquantized", t.file, name, qc.file(), module);
      const TensorView& scales = store.get(module + ".scales");
      if (scales.shape.size() != 2) fail("{}: tensor '{}' is not 2-D", scales.file, scales.name);
      const int64_t rows = t.dim(0), cols = scales.dim(1) * m.group;  // the codes' shape is checked against it
      item.kind = DenseKind::Quantized;
      item.quant = quant_tensors(store, qc, module, {}, rows, cols);
      specs->push_back({name + ".q", DType::U8, {rows, cols * m.bits / 8}});
      specs->push_back({name + ".scales", item.quant.scales->dtype, {rows, cols / m.group}});
      specs->push_back({name + ".biases", item.quant.scales->dtype, {rows, cols / m.group}});
    } else if (cfg.arch == Arch::Qwen3Next && t.shape.size() == 1 &&
               std::any_of(std::begin(kPlusOneNorms), std::end(kPlusOneNorms), [&](const char* s) { return ends_with(name, s); })) {
      item.kind = DenseKind::PlusOneNorm;
      specs->push_back({name, DType::F32, t.shape});
    } else if (name.find("conv1d.weight") != std::string::npos && t.shape.size() == 3 && t.dim(2) == 1) {
      item.kind = DenseKind::Conv1d;  // mlx's [C, K, 1] is the checkpoint's [C, 1, K]: the same bytes
      specs->push_back({name, t.dtype, {t.dim(0), 1, t.dim(1)}});
    } else {
      specs->push_back({name, t.dtype, t.shape});
    }
    items.push_back(item);
  }
  return items;
}

void write_mlx_dense(SafetensorsWriter& w, const MlxDense& item, Progress& progress) {
  const TensorView& t = *item.src;
  size_t consumed = t.nbytes;
  switch (item.kind) {
    case DenseKind::Quantized: {
      const QuantTensors& q = item.quant;
      w.write(item.first_spec, 0, q.q->data, q.q->nbytes);
      w.write(item.first_spec + 1, 0, q.scales->data, q.scales->nbytes);
      w.write(item.first_spec + 2, 0, q.biases->data, q.biases->nbytes);
      consumed += q.scales->nbytes + q.biases->nbytes;
      release(*q.scales);
      release(*q.biases);
      break;
    }
    case DenseKind::PlusOneNorm: {
      std::vector<float> v = t.to_f32();
      for (float& x : v) x -= 1.0f;
      w.write(item.first_spec, 0, v.data(), v.size() * 4);
      break;
    }
    case DenseKind::Conv1d:
    case DenseKind::Copy: w.write(item.first_spec, 0, t.data, t.nbytes); break;
  }
  release(t);
  progress.add(consumed);
}

// ---- the MTP head from the original checkpoint ----

struct MtpSource {
  TensorStore store;
  std::vector<const TensorView*> dense;
  std::vector<ExpertPlan> experts;
};

// mlx-lm drops `mtp.*`; --mtp-from takes it from the Hugging Face checkpoint the MLX one was
// made from (same config dims), converted as `convert` would (--expert-bits, --dense-bits).
std::unique_ptr<MtpSource> plan_mtp(const ModelConfig& cfg, const ConvertOptions& opt) {
  if (opt.mtp_from.empty()) return nullptr;
  const ModelConfig hf = load_config(opt.mtp_from);
  if (hf.hidden != cfg.hidden || hf.n_experts != cfg.n_experts || hf.moe_inter != cfg.moe_inter ||
      hf.vocab != cfg.vocab || hf.architecture != cfg.architecture)
    fail("--mtp-from {}: its config.json describes another model than {} (architecture, hidden_size, num_experts, "
         "moe_intermediate_size or vocab_size differ)",
         opt.mtp_from, opt.from);
  auto m = std::make_unique<MtpSource>(MtpSource{TensorStore::open(opt.mtp_from), {}, {}});
  for (const std::string& name : m->store.names())
    if (name.rfind("mtp.", 0) == 0 && name.find(".mlp.experts.") == std::string::npos) m->dense.push_back(&m->store.get(name));
  if (m->dense.empty()) fail("--mtp-from {}: the checkpoint has no 'mtp.*' tensors", opt.mtp_from);
  m->experts.push_back(plan_expert_block(cfg, m->store, opt, "mtp.layers.0.mlp", "mtp"));
  return m;
}

}  // namespace

bool is_mlx_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) return false;
  try {
    const json j = parse_json_file((fs::path(dir) / "config.json").string());
    if (j.contains("quantization")) return true;
  } catch (const Error&) {
    return false;
  }
  // An MLX layout without `quantization` (the importer names what is missing).
  const TensorStore store = TensorStore::open(dir);
  for (const std::string& name : store.names())
    if (name.find(kSwitch) != std::string::npos) return true;
  return false;
}

ConvertStats convert_mlx(const ConvertOptions& opt) {
  const auto start = std::chrono::steady_clock::now();
  const fs::path out(opt.out);
  const ModelConfig cfg = load_config(opt.from);
  const MlxQuantConfig qc((fs::path(opt.from) / "config.json").string());
  const TensorStore store = TensorStore::open(opt.from);

  std::vector<MlxExperts> experts;
  for (int l = 0; l < cfg.n_layers; ++l)
    if (cfg.is_moe(l)) experts.push_back(plan_mlx_block(cfg, store, qc, fmt::format("model.layers.{}.mlp", l)));
  std::vector<TensorSpec> specs;
  const std::vector<MlxDense> dense = plan_mlx_dense(cfg, store, qc, &specs);
  std::unique_ptr<MtpSource> mtp = plan_mtp(cfg, opt);
  std::vector<DenseItem> mtp_dense;
  if (mtp)
    for (const TensorView* t : mtp->dense) mtp_dense.push_back(plan_dense_tensor(*t, opt, &specs));

  ConvertStats stats;
  for (auto& name : store.names()) stats.bytes_in += store.get(name).nbytes;
  if (mtp) {
    for (const TensorView* t : mtp->dense) stats.bytes_in += t->nbytes;
    for (auto& s : mtp->experts[0].sources)
      for (const TensorView* t : s) stats.bytes_in += t->nbytes;
  }
  Progress progress(stats.bytes_in, opt.progress);

  TempDir tmp(out);
  {
    SafetensorsWriter w((tmp.path() / kEngineDenseFile).string(), specs);
    for (auto& item : dense) write_mlx_dense(w, item, progress);
    for (auto& item : mtp_dense) write_dense_item(w, item, progress);
    w.close();
  }
  fs::create_directory(tmp.path() / "experts");
  const int dense_bits = qc.default_bits() == 8 || qc.default_bits() == 4 ? qc.default_bits() : kRawBits;
  EngineIndex index{cfg.architecture, dense_bits, dense_bits == kRawBits ? 0 : qc.default_group(), {}};
  index.dense_checksums = dense_checksums((tmp.path() / kEngineDenseFile).string(), index.version);
  for (auto& x : experts) {
    write_mlx_experts(tmp.path(), x, progress);
    index.layers.push_back(x.layout);
  }
  if (mtp) {
    write_experts(tmp.path(), mtp->experts[0], progress);
    index.layers.push_back(mtp->experts[0].layout);
  }
  progress.finish();
  copy_side_files(opt.from, tmp.path());
  return commit_conversion(tmp, index, cfg, opt, stats, start);
}

}  // namespace ms
