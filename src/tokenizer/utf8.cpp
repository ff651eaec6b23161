#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace ms::utf8 {

namespace {

// Length of the sequence a lead byte starts (0: not a lead byte) and the range its second
// byte must lie in; later bytes are always 0x80..0xBF. These ranges exclude overlongs,
// surrogates and code points above U+10FFFF.
struct Lead {
  int len;
  unsigned char lo, hi;
};

Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

enum class Seq { Valid, Invalid, Truncated };

// Classifies the sequence at s[i]; `len` is the bytes it covers (for Invalid: the maximal
// subpart to replace by one U+FFFD; for Truncated: the valid prefix up to the end of s).
Seq classify(std::string_view s, size_t i, size_t* len) {
  Lead l = lead_of(static_cast<unsigned char>(s[i]));
  if (l.len == 0) {
    *len = 1;
    return Seq::Invalid;
  }
  for (int k = 1; k < l.len; ++k) {
    if (i + size_t(k) >= s.size()) {
      *len = size_t(k);
      return Seq::Truncated;
    }
    auto c = static_cast<unsigned char>(s[i + size_t(k)]);
    bool ok = k == 1 ? (c >= l.lo && c <= l.hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) {
      *len = size_t(k);
      return Seq::Invalid;
    }
  }
  *len = size_t(l.len);
  return Seq::Valid;
}

}  // namespace

size_t first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    if (classify(s, i, &len) != Seq::Valid) return i;
    i += len;
  }
  return std::string_view::npos;
}

char32_t next(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int len = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  char32_t cp = b & (0x3F >> (len - 1));
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3F);
  i += size_t(len);
  return cp;
}

char32_t prev(std::string_view s, size_t end, size_t* start) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  *start = i;
  return next(s, i);
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

size_t append_lossy(std::string& out, std::string_view in, bool at_end) {
  size_t i = 0;
  while (i < in.size()) {
    size_t len;
    switch (classify(in, i, &len)) {
      case Seq::Valid:
        out.append(in.data() + i, len);
        break;
      case Seq::Truncated:
        if (!at_end) return i;
        [[fallthrough]];
      case Seq::Invalid:
        append(out, 0xFFFD);
        break;
    }
    i += len;
  }
  return i;
}

bool is_white_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace ms::utf8
