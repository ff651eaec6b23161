// The tokenizer loader (tokenizer/tokenizer.cpp): tokenizer.json text. An accepted tokenizer
// then encodes and decodes a fixed set of texts; every id it produces must be in its vocabulary.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace {

// Plain words, chat markers, digits, whitespace runs, combining marks (NFC), CJK and emoji.
constexpr std::string_view kTexts[] = {
    "Hello, world! It's 2026.",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n\treturn x  +  1\n\n\n",
    "e\xcc\x81t\xc3\xa9 \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82",
    "   \r\n  trailing   ",
};

void encode_decode(const ms::Tokenizer& tok, std::string_view text) {
  const std::vector<int> ids = tok.encode(text);
  for (int id : ids)
    if (id < 0 || id >= tok.vocab_size()) ms::fuzz::accepted_invalid("encode gave an id outside the vocabulary");
  (void)tok.decode(ids);
  ms::StreamDecoder stream(tok);
  for (int id : ids) (void)stream.push(id);
  (void)stream.flush();
}

// Every id's text and kind, for the first 64k ids.
void walk_vocabulary(const ms::Tokenizer& tok) {
  const int n = std::min(tok.vocab_size(), 1 << 16);
  for (int id = 0; id < n; ++id) {
    (void)tok.token_text(id);
    (void)tok.is_special(id);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ms::fuzz::write_scratch("tokenizer.json", data, size);
  try {
    const ms::Tokenizer tok = ms::Tokenizer::load(path);
    if (tok.vocab_size() < 0) ms::fuzz::accepted_invalid("a negative vocabulary size");
    for (std::string_view text : kTexts) encode_decode(tok, text);
    walk_vocabulary(tok);
  } catch (const ms::Error& e) {
    // A refused file, or a text its vocabulary cannot encode: the expected outcomes.
    ms::fuzz::refused(e);
  }
  return 0;
}
