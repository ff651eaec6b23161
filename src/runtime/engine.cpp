#include "runtime/engine.h"

#include <fmt/format.h>

#include "backends/load.h"
#include "runtime/speculative.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/json.h"

namespace ms {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json_if_present(const fs::path& p) {
  if (!fs::exists(p)) return json();
  return parse_json_file(p.string());
}

void add_unique(std::vector<int>& ids, int id) {
  if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

// generation_config.json's eos_token_id: an id or a flat list of ids, each inside the vocabulary.
void add_ids(std::vector<int>& ids, const json& v, const std::string& where, int vocab) {
  if (v.is_null()) return;
  const auto add = [&](const json& e) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab)
      fail("{}: eos_token_id {} is not a token id in the vocabulary [0, {})", where, json_summary(e), vocab);
    add_unique(ids, e.get<int>());
  };
  if (!v.is_array()) return add(v);
  for (auto& e : v) add(e);
}

}  // namespace

bool Engine::is_eos(int id) const { return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end(); }

Engine::~Engine() {
  if (model_) save_usage();
}

void save_usage_or_warn(const Model& model) {
  try {
    model.save_usage();
  } catch (const std::exception& e) {
    fmt::print(stderr, "moestream: warning: the usage history was not saved: {}\n", e.what());
  }
}

std::unique_ptr<Engine> Engine::load(const std::string& dir, const ModelOptions& opt) {
  auto e = std::make_unique<Engine>();
  e->dir_ = dir;
  e->model_ = load_model(dir, opt);
  e->speculative_ = resolve_speculative(*e->model_, opt.speculative, dir);
  const fs::path tok = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(tok)) fail("{}: no tokenizer.json (text commands need the model's tokenizer)", dir);
  e->tokenizer_.emplace(Tokenizer::load(tok.string()));

  const fs::path tok_cfg = fs::path(dir) / "tokenizer_config.json";
  json tc = read_json_if_present(tok_cfg);
  if (tc.is_object() && tc.contains("chat_template")) e->chat_template_.emplace(ChatTemplate::from_tokenizer_config(tok_cfg.string()));

  for (int id : e->model_->config().eos_ids) add_unique(e->eos_ids_, id);
  const fs::path gen_cfg = fs::path(dir) / "generation_config.json";
  json gc = read_json_if_present(gen_cfg);
  if (gc.is_object() && gc.contains("eos_token_id")) add_ids(e->eos_ids_, gc["eos_token_id"], gen_cfg.string(), e->model_->config().vocab);
  if (tc.is_object() && tc.contains("eos_token")) {
    const json& t = tc["eos_token"];
    const std::string text = t.is_string() ? t.get<std::string>() : t.is_object() ? t.value("content", "") : "";
    add_unique(e->eos_ids_, e->tokenizer_->token_id(text));
  }
  return e;
}

}  // namespace ms
