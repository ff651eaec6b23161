#pragma once
// A Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2, Qwen, Llama-3 family),
// encoding and decoding exactly as the `tokenizers` library does:
//   added tokens (matched first) -> NFC -> the pre-tokenizer's Split patterns -> byte-level
//   alphabet -> BPE merges by rank;  decoding: ids -> bytes -> UTF-8 (invalid bytes as U+FFFD).
// Anything outside that family (other models, normalizers, pre-tokenizers, post-processors)
// is refused at load with an error naming the file and the field.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/marked_text.h"

namespace ms {

class Tokenizer {
 public:
  static Tokenizer load(const std::string& tokenizer_json_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Text must be valid UTF-8. Added and special tokens in it are recognised (as HF does with
  // its defaults); no BOS/EOS is added. Thread-safe.
  std::vector<int> encode(std::string_view text) const;
  // The same, except that added and special tokens are not recognised where any of their
  // bytes is in text.untrusted: a chat's request text is tokenized as text, so only the
  // markers the chat template itself writes become control tokens. Text without untrusted
  // ranges, or whose untrusted ranges hold no token's text, encodes as encode(text.text).
  std::vector<int> encode(const MarkedText& text) const;
  // Ids without a token (e.g. padding rows of the embedding) decode to nothing, as in HF.
  std::string decode(const std::vector<int>& ids) const;

  // The id of a token by its vocabulary spelling ("<|im_end|>", "Ġthe"), or -1.
  int token_id(std::string_view token) const;
  // The raw bytes token `id` decodes to; may be part of a UTF-8 character. Empty for an id
  // without a token (which decode() skips).
  const std::string& token_text(int id) const;
  // One more than the largest id (model vocabulary and added tokens).
  int vocab_size() const;
  bool is_special(int id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental decoding for generation: push ids as they are sampled and get back only whole
// characters; the bytes of a character split across tokens wait until it completes.
// The concatenation of all push() results and flush() equals tokenizer.decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
  std::string push(int id);
  // Whatever is still held (an incomplete character) as U+FFFD; the decoder starts afresh.
  std::string flush();

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace ms
