#pragma once
// What a text front end (run, chat, serve) needs of a model directory: the model, its
// tokenizer, its chat template and the ids that end a sequence.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ms {

// Model::save_usage, a failure a one-line warning on stderr: the history only ever warms pools.
void save_usage_or_warn(const Model& model);

class Engine {
 public:
  static std::unique_ptr<Engine> load(const std::string& dir, const ModelOptions& opt = {});
  // Writes the model's usage history (save_usage).
  ~Engine();
  void save_usage() const { save_usage_or_warn(*model_); }

  const std::string& dir() const { return dir_; }
  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Null when tokenizer_config.json has no chat_template.
  const ChatTemplate* chat_template() const { return chat_template_ ? &*chat_template_ : nullptr; }
  // From config.json, generation_config.json and tokenizer_config.json, without repeats.
  const std::vector<int>& eos_ids() const { return eos_ids_; }
  bool is_eos(int id) const;
  // What generations speculate with unless a request says otherwise (ModelOptions::speculative).
  const SpeculativeOptions& speculative() const { return speculative_; }

 private:
  std::string dir_;
  std::unique_ptr<Model> model_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::vector<int> eos_ids_;
  SpeculativeOptions speculative_;
};

}  // namespace ms
