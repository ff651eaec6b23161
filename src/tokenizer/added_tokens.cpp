#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace ms {

void AddedTokenMatcher::add(const AddedToken& token) {
  if (token.content.empty()) return;
  tokens_.push_back(token);
  auto& bucket = by_first_byte_[static_cast<unsigned char>(token.content[0])];
  bucket.push_back(tokens_.size() - 1);
  std::stable_sort(bucket.begin(), bucket.end(), [&](size_t a, size_t b) {
    return tokens_[a].content.size() > tokens_[b].content.size();
  });
}

const AddedToken* AddedTokenMatcher::longest_at(std::string_view text, size_t pos,
                                                const std::vector<ByteRange>& untrusted) const {
  for (size_t i : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    const std::string& c = tokens_[i].content;
    if (text.compare(pos, c.size(), c) == 0 && !overlaps(untrusted, pos, pos + c.size())) return &tokens_[i];
  }
  return nullptr;
}

namespace {

bool word_char_before(std::string_view text, size_t pos) {
  if (pos == 0) return false;
  size_t start;
  return utf8::is_word_char(utf8::prev(text, pos, &start));
}

bool word_char_after(std::string_view text, size_t pos) {
  if (pos >= text.size()) return false;
  return utf8::is_word_char(utf8::next(text, pos));
}

size_t skip_space_back(std::string_view text, size_t pos) {
  while (pos > 0) {
    size_t start;
    if (!utf8::is_white_space(utf8::prev(text, pos, &start))) break;
    pos = start;
  }
  return pos;
}

size_t skip_space_forward(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    size_t next = pos;
    if (!utf8::is_white_space(utf8::next(text, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<Piece>& out,
                              const std::vector<ByteRange>& untrusted) const {
  size_t done = 0;  // text before this is already in `out`
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* t = by_first_byte_[static_cast<unsigned char>(text[pos])].empty()
                              ? nullptr
                              : longest_at(text, pos, untrusted);
    if (!t) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + t->content.size();
    // A match is found without regard to flags; single_word then discards it (and the scan
    // goes on after it, as a non-overlapping matcher would).
    if (t->single_word && (word_char_before(text, begin) || word_char_after(text, end))) {
      pos = end;
      continue;
    }
    if (t->lstrip) begin = std::max(skip_space_back(text, begin), done);
    if (t->rstrip) end = skip_space_forward(text, end);
    if (begin > done) out.push_back({done, begin, -1});
    out.push_back({begin, end, t->id});
    done = pos = end;
  }
  if (done < text.size()) out.push_back({done, text.size(), -1});
}

}  // namespace ms
