#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace ms {

std::string StreamDecoder::push(int id) {
  pending_ += tok_->token_text(id);
  std::string out;
  pending_.erase(0, utf8::append_lossy(out, pending_, false));
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8::append_lossy(out, pending_, true);
  pending_.clear();
  return out;
}

}  // namespace ms
