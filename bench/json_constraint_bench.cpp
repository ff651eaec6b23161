// The time constrained decoding adds to a pick (chat/json_constraint.h): the mask of every step
// of a JSON answer and of a forced tool call, tokenized with a real vocabulary, in microseconds a
// step (median over the answer's steps), beside the vocabulary's size. Compare with a decode
// step of the same model (`moestream bench`'s tg row).
//
//   bench_json_constraint [TOKENIZER_JSON...]   (default: pycoder-moe-q4's and Qwen3's)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "chat/json_constraint.h"
#include "chat/json_schema.h"
#include "tokenizer/tokenizer.h"

using namespace ms;

namespace {

// Median and mean microseconds of c.allowed() over the steps of `text`'s tokens, each then
// accepted (masks are kept by state: the mean counts the first sight of each).
template <class Constraint>
std::pair<double, double> mask_us(Constraint& c, const Tokenizer& tok, const std::string& text) {
  std::vector<double> us;
  for (int id : tok.encode(text)) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint8_t allowed = c.allowed()[size_t(id)];
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (!allowed) std::printf("  (token %d was masked: the text is not what the constraint takes)\n", id);
    c.accept(id);
  }
  double sum = 0;
  for (double u : us) sum += u;
  std::nth_element(us.begin(), us.begin() + std::ptrdiff_t(us.size() / 2), us.end());
  return {us[us.size() / 2], sum / double(us.size())};
}

}  // namespace

// The JSON answer's schema (every member required, in order).
constexpr const char* kSchema = R"({"type": "object", "additionalProperties": false,
  "required": ["name", "x", "y", "tags", "valid", "meta"],
  "properties": {"name": {"type": "string"}, "x": {"type": "number"}, "y": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}}, "valid": {"type": "boolean"},
    "meta": {"type": "object", "properties": {"source": {"enum": ["bench", "test"]}}, "required": ["source"]}}})";

int main(int argc, char** argv) {
  std::vector<std::string> files(argv + 1, argv + argc);
  if (files.empty())
    files = {MOESTREAM_SOURCE_DIR "/models/pycoder-moe-q4/tokenizer.json",
             MOESTREAM_SOURCE_DIR "/../shared/tokenizers/qwen3/tokenizer.json"};
  const std::string json =
      R"({"name": "point", "x": 1.5, "y": -2, "tags": ["a", "b\n"], "valid": true, "meta": {"source": "bench"}})";
  const std::string call =
      "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/main.cpp\", \"lines\": [1, 20]}}\n</tool_call>";
  for (const std::string& f : files) {
    const Tokenizer tok = Tokenizer::load(f);
    const auto t0 = std::chrono::steady_clock::now();
    const std::shared_ptr<const TokenTries> tries = token_tries(tok);  // built once, kept by the session
    std::printf("%s: the vocabulary's tries built in %.1f ms\n", f.c_str(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    JsonConstraint j(tok, {}, JsonAcceptor());
    ToolCallConstraint t(tok, {}, ToolCallAcceptor({"list_dir", "read_file"}));
    const auto [jm, ja] = mask_us(j, tok, json);
    const auto [tm, ta] = mask_us(t, tok, call);
    SchemaConstraint s(tok, {}, SchemaAcceptor(JsonSchema::compile(nlohmann::ordered_json::parse(kSchema))));
    const auto [sm, sa] = mask_us(s, tok, json);
    std::printf("%s: vocab %d, mask a step (median / mean): JSON object %.0f / %.0f us, JSON schema %.0f / %.0f us, "
                "forced tool call %.0f / %.0f us\n",
                f.c_str(), tok.vocab_size(), jm, ja, sm, sa, tm, ta);
  }
  return 0;
}
