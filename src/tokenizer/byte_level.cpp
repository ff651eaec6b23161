#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace ms::byte_level {

bool unmap(std::string_view spelling, std::string* out) {
  std::string bytes;
  bytes.reserve(spelling.size());
  for (size_t i = 0; i < spelling.size();) {
    int b = char_to_byte(utf8::next(spelling, i));
    if (b < 0) return false;
    bytes += char(b);
  }
  *out = std::move(bytes);
  return true;
}

std::string map(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8::append(out, byte_to_char()[b]);
  return out;
}

}  // namespace ms::byte_level
