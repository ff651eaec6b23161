#include "runtime/engine.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace ms {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json_if_present(const fs::path& p) {
  if (!fs::exists(p)) return json();
  std::ifstream in(p);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", p.string(), e.what());
  }
}

void add_unique(std::vector<int>& ids, int id) {
  if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

void add_ids(std::vector<int>& ids, const json& v, const std::string& where) {
  if (v.is_null()) return;
  if (v.is_number_integer()) return add_unique(ids, v.get<int>());
  if (!v.is_array()) fail("{}: eos_token_id must be an integer or a list of integers, is {}", where, v.dump());
  for (auto& e : v) add_ids(ids, e, where);
}

}  // namespace

bool Engine::is_eos(int id) const { return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end(); }

std::unique_ptr<Engine> Engine::load(const std::string& dir, const ModelOptions& opt) {
  auto e = std::make_unique<Engine>();
  e->dir_ = dir;
  e->model_ = Model::load(dir, opt);
  const fs::path tok = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(tok)) fail("{}: no tokenizer.json (text commands need the model's tokenizer)", dir);
  e->tokenizer_.emplace(Tokenizer::load(tok.string()));

  const fs::path tok_cfg = fs::path(dir) / "tokenizer_config.json";
  json tc = read_json_if_present(tok_cfg);
  if (tc.is_object() && tc.contains("chat_template")) e->chat_template_.emplace(ChatTemplate::from_tokenizer_config(tok_cfg.string()));

  for (int id : e->model_->config().eos_ids) add_unique(e->eos_ids_, id);
  const fs::path gen_cfg = fs::path(dir) / "generation_config.json";
  json gc = read_json_if_present(gen_cfg);
  if (gc.is_object() && gc.contains("eos_token_id")) add_ids(e->eos_ids_, gc["eos_token_id"], gen_cfg.string());
  if (tc.is_object() && tc.contains("eos_token")) {
    const json& t = tc["eos_token"];
    const std::string text = t.is_string() ? t.get<std::string>() : t.is_object() ? t.value("content", "") : "";
    add_unique(e->eos_ids_, e->tokenizer_->token_id(text));
  }
  return e;
}

}  // namespace ms
