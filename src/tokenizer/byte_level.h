#pragma once
// GPT-2's byte-level alphabet: every byte is spelled as one printable code point, so that
// a vocabulary of strings can hold arbitrary bytes. Printable Latin-1 bytes stand for
// themselves; the other 68 bytes (controls, space, DEL, NBSP, soft hyphen) become
// U+0100.. in byte order (space is U+0120 'Ġ', newline U+010A 'Ċ').
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ms::byte_level {

inline bool stands_for_itself(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

inline const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) t[size_t(b)] = stands_for_itself(b) ? char32_t(b) : next++;
    return t;
  }();
  return table;
}

// The byte a code point spells, or -1 when it is not in the alphabet.
inline int char_to_byte(char32_t cp) {
  static const std::array<int16_t, 0x144> table = [] {
    std::array<int16_t, 0x144> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_char()[size_t(b)]] = int16_t(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

// The bytes a vocabulary spelling stands for; false (out untouched) when one of its code
// points is outside the alphabet. `spelling` must be valid UTF-8.
bool unmap(std::string_view spelling, std::string* out);

// The spelling of raw bytes.
std::string map(std::string_view bytes);

}  // namespace ms::byte_level
