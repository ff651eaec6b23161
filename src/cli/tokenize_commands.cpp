// `tokenize` and `detokenize`: the model's tokenizer on stdin/stdout, for scripts and checks.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/json.h"

namespace ms::cli {

namespace {

struct TokenizerSource {
  std::string model_dir;
  std::string file;
  std::string path() const { return file.empty() ? model_dir + "/tokenizer.json" : file; }
};

void add_source_options(CLI::App* cmd, TokenizerSource& src) {
  auto* group = cmd->add_option_group("tokenizer", "Where the tokenizer comes from");
  group->add_option("--model", src.model_dir, "Model directory (its tokenizer.json)")->check(non_empty());
  group->add_option("--tokenizer", src.file, "A tokenizer.json file")->check(non_empty());
  group->require_option(1);
}

std::string read_stdin() {
  std::cin >> std::noskipws;
  return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
}

void tokenize(const TokenizerSource& src) {
  Tokenizer tok = Tokenizer::load(src.path());
  std::vector<int> ids = tok.encode(read_stdin());
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// The ids of a JSON array, each checked to be an id of the tokenizer's vocabulary.
std::vector<int> parse_ids(const std::string& text, int vocab_size) {
  const nlohmann::json j = parse_json(text, "detokenize: stdin");
  if (!j.is_array()) fail("detokenize: stdin must be a JSON array of token ids");
  std::vector<int> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer()) fail("detokenize: element {} of the array is not an integer", i);
    const bool in_range = j[i].is_number_unsigned() ? j[i].get<uint64_t>() < uint64_t(vocab_size)
                                                    : j[i].get<int64_t>() >= 0 && j[i].get<int64_t>() < vocab_size;
    if (!in_range)
      fail("detokenize: id {} (element {}) is outside the vocabulary of {} ids (0 to {})", j[i].dump(), i, vocab_size,
           vocab_size - 1);
    ids.push_back(j[i].get<int>());
  }
  return ids;
}

void detokenize(const TokenizerSource& src) {
  Tokenizer tok = Tokenizer::load(src.path());
  std::string text = tok.decode(parse_ids(read_stdin(), tok.vocab_size()));
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

void register_tokenize_commands(CLI::App& app) {
  auto src = std::make_shared<TokenizerSource>();
  auto* enc = app.add_subcommand("tokenize", "Read text on stdin, print its token ids as a JSON array");
  add_source_options(enc, *src);
  enc->callback([src] { tokenize(*src); });

  auto dsrc = std::make_shared<TokenizerSource>();
  auto* dec = app.add_subcommand("detokenize", "Read a JSON array of token ids on stdin, print the text");
  add_source_options(dec, *dsrc);
  dec->callback([dsrc] { detokenize(*dsrc); });
}

}  // namespace ms::cli
