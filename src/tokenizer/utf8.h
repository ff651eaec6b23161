#pragma once
// UTF-8 helpers for the tokenizer: validation, code point decoding, and the lossy decoding
// Hugging Face applies to decoded bytes (each maximal invalid subpart becomes one U+FFFD,
// as Rust's String::from_utf8_lossy does).
#include <cstddef>
#include <string>
#include <string_view>

namespace ms::utf8 {

// Offset of the first byte that is not part of a valid UTF-8 sequence, or npos when all is valid.
size_t first_invalid(std::string_view s);

// Decodes the (valid) code point starting at s[i] and advances i past it.
char32_t next(std::string_view s, size_t& i);
// Decodes the (valid) code point ending just before s[end]; returns it and its first byte's offset.
char32_t prev(std::string_view s, size_t end, size_t* start);

void append(std::string& out, char32_t cp);

// Appends `in` to `out` as valid UTF-8, each invalid subpart replaced by U+FFFD. When `at_end` is
// false, a trailing sequence that is incomplete but could still become valid is left unconsumed.
// Returns how many bytes of `in` were consumed.
size_t append_lossy(std::string& out, std::string_view in, bool at_end);

// Unicode White_Space (what Rust's char::is_whitespace and regex \s match).
bool is_white_space(char32_t cp);
// Regex \w: letters, marks, decimal digits, connector punctuation, join controls.
bool is_word_char(char32_t cp);

}  // namespace ms::utf8
