#include "writers/convert.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <set>
#include <vector>

#include "format/config.h"
#include "format/engine_dir.h"
#include "format/safetensors.h"
#include "util/error.h"
#include "util/half.h"
#include "writers/convert_parts.h"
#include "writers/engine_writer.h"
#include "writers/import_gguf.h"
#include "writers/import_mlx.h"

namespace ms {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

bool is_float(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

}  // namespace

// Without this the resident set would grow to the whole checkpoint.
void release(const TensorView& t) {
  if (t.nbytes == 0) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(t.data) + t.nbytes;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

namespace {

// Elements [first, first + n) of a float tensor as float32.
void read_f32(const TensorView& t, size_t first, size_t n, float* out) {
  switch (t.dtype) {
    case DType::F32: std::memcpy(out, t.as<float>() + first, n * 4); break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(t.as<bf16>()[first + i]);
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) out[i] = f16_to_f32(t.as<f16>()[first + i]);
      break;
    default: fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32", t.file, t.name, dtype_name(t.dtype));
  }
}

// The tensor as bf16: bf16 sources are copied bit for bit.
void read_bf16(const TensorView& t, uint16_t* out) {
  const size_t n = size_t(t.numel());
  if (t.dtype == DType::BF16) {
    std::memcpy(out, t.data, n * 2);
    return;
  }
  std::vector<float> f(n);
  read_f32(t, 0, n, f.data());
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(f[i]);
}

// ---- planning ----

std::string expert_tensor(const std::string& block, int e, size_t proj) {
  return fmt::format("{}.experts.{}.{}_proj.weight", block, e, kExpertProjections[proj]);
}

int bits_for(const ConvertOptions& opt, const std::string& layer_key, size_t proj) {
  if (auto it = opt.layer_bits.find(layer_key); it != opt.layer_bits.end()) return it->second;
  if (auto it = opt.proj_bits.find(kExpertProjections[proj]); it != opt.proj_bits.end()) return it->second;
  return opt.expert_bits;
}

}  // namespace

ExpertPlan plan_expert_block(const ModelConfig& cfg, const TensorStore& store, const ConvertOptions& opt,
                             const std::string& block, const std::string& layer_key) {
  const int H = cfg.hidden, I = cfg.moe_inter;
  std::array<ProjSpec, 3> spec;
  for (size_t p = 0; p < 3; ++p)
    spec[p] = {bits_for(opt, layer_key, p), opt.expert_group, p == 2 ? H : I, p == 2 ? I : H};
  ExpertPlan plan{plan_expert_layer(block, expert_file_name(block), cfg.n_experts, spec, opt.format_version), {}};
  for (int e = 0; e < cfg.n_experts; ++e) {
    std::array<const TensorView*, 3> src;
    for (size_t p = 0; p < 3; ++p) {
      const TensorView& t = store.get(expert_tensor(block, e, p));
      if (!is_float(t.dtype))
        fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32", t.file, t.name, dtype_name(t.dtype));
      t.expect(t.dtype, {spec[p].rows, spec[p].cols});
      src[p] = &t;
    }
    plan.sources.push_back(src);
  }
  return plan;
}

namespace {

std::vector<ExpertPlan> plan_experts(const ModelConfig& cfg, const TensorStore& store, const ConvertOptions& opt) {
  std::vector<ExpertPlan> plans;
  for (int l = 0; l < cfg.n_layers; ++l)
    if (cfg.is_moe(l)) plans.push_back(plan_expert_block(cfg, store, opt, fmt::format("model.layers.{}.mlp", l), std::to_string(l)));
  if (store.has(expert_tensor("mtp.layers.0.mlp", 0, 0))) plans.push_back(plan_expert_block(cfg, store, opt, "mtp.layers.0.mlp", "mtp"));
  for (auto& [key, bits] : opt.layer_bits) {
    const bool known = std::any_of(plans.begin(), plans.end(), [&](const ExpertPlan& p) {
      return p.layout.name == (key == "mtp" ? "mtp.layers.0.mlp" : fmt::format("model.layers.{}.mlp", key));
    });
    if (!known) fail("--layer-bits: layer {} is not a MoE layer of this model", key);
  }
  return plans;
}

bool is_expert_tensor(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

std::vector<DenseItem> plan_dense(const TensorStore& store, const std::vector<ExpertPlan>& experts,
                                  const ConvertOptions& opt, std::vector<TensorSpec>* specs) {
  std::set<const TensorView*> expert_sources;
  for (auto& p : experts)
    for (auto& s : p.sources) expert_sources.insert(s.begin(), s.end());
  std::vector<DenseItem> items;
  for (const std::string& name : store.names()) {
    const TensorView& t = store.get(name);
    if (expert_sources.count(&t)) continue;
    if (is_expert_tensor(name)) fail("{}: tensor '{}' looks like a routed expert but is outside the model's experts", t.file, name);
    items.push_back(plan_dense_tensor(t, opt, specs));
  }
  return items;
}

}  // namespace

DenseItem plan_dense_tensor(const TensorView& t, const ConvertOptions& opt, std::vector<TensorSpec>* specs) {
  DenseItem item{&t, dense_bits_for(t.name, t.shape, is_float(t.dtype), opt.dense_bits, opt.dense_group), opt.dense_group};
  item.first_spec = add_dense_specs(t.name, t.dtype, t.shape, item.bits, item.group, specs);
  return item;
}

// ---- writing ----

void write_dense_item(SafetensorsWriter& w, const DenseItem& item, Progress& progress) {
  const TensorView& t = *item.src;
  if (item.bits == kRawBits) {
    constexpr size_t kPiece = kDenseChunkValues * 4;
    const auto* p = static_cast<const uint8_t*>(t.data);
    for (size_t off = 0; off < t.nbytes; off += kPiece) w.write(item.first_spec, off, p + off, std::min(kPiece, t.nbytes - off));
  } else {
    const size_t rows = size_t(t.dim(0)), cols = size_t(t.dim(1));
    const size_t rows_per_piece = dense_rows_per_piece(cols);
    std::vector<float> f;
    for (size_t r0 = 0; r0 < rows; r0 += rows_per_piece) {
      const size_t n = std::min(rows_per_piece, rows - r0);
      f.resize(n * cols);
      read_f32(t, r0 * cols, n * cols, f.data());
      write_quantized_rows(w, item.first_spec, r0, f.data(), int(n), int(cols), item.bits, item.group,
                           fmt::format("{}: tensor '{}'", t.file, t.name));
    }
  }
  release(t);
  progress.add(t.nbytes);
}

namespace {

// One expert's record: each projection quantized (or as bf16) into its place.
void fill_record(const ExpertLayer& layout, const std::array<const TensorView*, 3>& src, std::vector<uint8_t>& rec,
                 std::vector<float>& f) {
  for (size_t p = 0; p < 3; ++p) {
    const ProjLayout& pl = layout.proj[p];
    const TensorView& t = *src[p];
    if (pl.bits == kRawBits) {  // bf16 sources bit for bit
      read_bf16(t, reinterpret_cast<uint16_t*>(rec.data() + pl.q_offset));
      continue;
    }
    f.resize(size_t(t.numel()));
    read_f32(t, 0, f.size(), f.data());
    put_projection(pl, f.data(), rec.data(), fmt::format("{}: tensor '{}'", t.file, t.name));
  }
}

}  // namespace

void write_experts(const fs::path& dir, ExpertPlan& plan, Progress& progress) {
  write_expert_blob(
      dir, plan.layout,
      [&](size_t e, std::vector<uint8_t>& rec, std::vector<float>& f) { fill_record(plan.layout, plan.sources[e], rec, f); },
      [&](size_t e) {
        size_t consumed = 0;
        for (const TensorView* t : plan.sources[e]) {
          release(*t);
          consumed += t->nbytes;
        }
        progress.add(consumed);
      });
}

void copy_side_files(const fs::path& from, const fs::path& dir) {
  for (const char* f : kEngineSideFiles) {
    const fs::path src = from / f;
    if (!fs::exists(src)) continue;
    fs::copy_file(src, dir / f);
    fs::permissions(dir / f, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  }
}

ConvertStats commit_conversion(TempDir& tmp, const EngineIndex& index, const ModelConfig& cfg, const ConvertOptions& opt,
                               ConvertStats stats, std::chrono::steady_clock::time_point start) {
  write_text_file(tmp.path() / kEngineIndexFile, engine_index_json(index, cfg));
  stats.bytes_out = directory_bytes(tmp.path());
  tmp.commit(opt.out, opt.force);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

size_t directory_bytes(const fs::path& dir) {
  size_t n = 0;
  for (auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

namespace {

void check_options(const ConvertOptions& opt) {
  if (opt.from.empty()) fail("--from: a checkpoint directory is required");
  if (opt.out.empty()) fail("--out: an output directory is required");
  check_bits("--expert-bits", opt.expert_bits, {2, 3, 4, 8, 16});
  check_bits("--expert-group", opt.expert_group, {32, 64, 128});
  check_bits("--dense-bits", opt.dense_bits, {4, 8, 16});
  check_bits("--dense-group", opt.dense_group, {32, 64, 128});
  for (auto& [proj, bits] : opt.proj_bits) {
    if (std::find(kExpertProjections.begin(), kExpertProjections.end(), proj) == kExpertProjections.end())
      fail("--proj-bits: '{}' is not a projection (gate, up, down)", proj);
    check_bits("--proj-bits", bits, {2, 3, 4, 8, 16});
  }
  for (auto& [layer, bits] : opt.layer_bits) check_bits("--layer-bits", bits, {2, 3, 4, 8, 16});
  if (fs::weakly_canonical(opt.from) == fs::weakly_canonical(opt.out)) fail("--out {} is the checkpoint itself", opt.out);
}

}  // namespace

std::map<std::string, int> parse_bits_list(const std::string& flag, const std::string& s, char sep) {
  std::map<std::string, int> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    const size_t at = item.find(sep);
    size_t used = 0;
    int bits = -1;
    try {
      if (at != std::string::npos) bits = std::stoi(item.substr(at + 1), &used);
    } catch (const std::exception&) {
    }
    if (at == 0 || at == std::string::npos || used == 0 || used != item.size() - at - 1)
      fail("{}: '{}' is not KEY{}BITS", flag, item, sep);
    if (!out.emplace(item.substr(0, at), bits).second)
      fail("{}: '{}' is given twice ({}{}{} and {}{}{})", flag, item.substr(0, at), item.substr(0, at), sep,
           out[item.substr(0, at)], item.substr(0, at), sep, bits);
    pos = comma + 1;
  }
  return out;
}

namespace {

// The quantization flags shape a Hugging Face conversion; an import keeps its file's own
// quantization, so they are refused rather than ignored. With --mtp-from they shape the MTP
// layer an MLX import takes from the Hugging Face checkpoint.
void check_import_flags(const ConvertOptions& opt, const char* kind) {
  if (!opt.mtp_from.empty()) return;
  const ConvertOptions d;
  const std::pair<bool, const char*> flags[] = {
      {opt.expert_bits != d.expert_bits, "--expert-bits"}, {opt.expert_group != d.expert_group, "--expert-group"},
      {!opt.proj_bits.empty(), "--proj-bits"},            {!opt.layer_bits.empty(), "--layer-bits"},
      {opt.dense_bits != d.dense_bits, "--dense-bits"},    {opt.dense_group != d.dense_group, "--dense-group"}};
  for (const auto& [set, flag] : flags)
    if (set)
      fail("{}: {} import keeps {}'s own quantization, every weight as stored; to requantize, convert the "
           "original Hugging Face checkpoint",
           flag, kind, opt.from);
}

}  // namespace

ConvertStats convert_checkpoint(const ConvertOptions& opt) {
  const auto start = Clock::now();
  check_options(opt);
  const fs::path out(opt.out);
  if (fs::exists(out) && !opt.force) fail("{}: already exists (use --force to replace it)", opt.out);
  if (is_gguf_file(opt.from)) {
    if (!opt.mtp_from.empty()) fail("--mtp-from: only an MLX checkpoint takes it");
    check_import_flags(opt, "a GGUF");
    return convert_gguf(opt);
  }
  if (!fs::is_directory(opt.from)) fail("--from {}: not a checkpoint directory or a GGUF file", opt.from);
  if (is_mlx_checkpoint(opt.from)) {
    check_import_flags(opt, "an MLX");
    return convert_mlx(opt);
  }
  if (!opt.mtp_from.empty()) fail("--mtp-from: only an MLX checkpoint (which has no MTP head) takes it");
  const ModelConfig cfg = load_config(opt.from);
  const TensorStore store = TensorStore::open(opt.from);

  std::vector<ExpertPlan> experts = plan_experts(cfg, store, opt);
  std::vector<TensorSpec> specs;
  const std::vector<DenseItem> dense = plan_dense(store, experts, opt, &specs);
  ConvertStats stats;
  for (auto& name : store.names()) stats.bytes_in += store.get(name).nbytes;
  Progress progress(stats.bytes_in, opt.progress);

  TempDir tmp(out);
  {
    SafetensorsWriter w((tmp.path() / kEngineDenseFile).string(), specs);
    for (auto& item : dense) write_dense_item(w, item, progress);
    w.close();
  }
  fs::create_directory(tmp.path() / "experts");
  EngineIndex index{cfg.architecture, opt.dense_bits, opt.dense_bits == kRawBits ? 0 : opt.dense_group, {}};
  index.version = opt.format_version;
  if (index.version >= 2) index.dense_checksums = dense_checksums((tmp.path() / kEngineDenseFile).string(), index.version);
  for (auto& plan : experts) {
    write_experts(tmp.path(), plan, progress);
    index.layers.push_back(plan.layout);
  }
  progress.finish();
  copy_side_files(opt.from, tmp.path());
  return commit_conversion(tmp, index, cfg, opt, stats, start);
}

}  // namespace ms
