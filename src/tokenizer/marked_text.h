#pragma once
// Text with the byte ranges that came from an untrusted source (a request's messages, tools
// and template variables). The tokenizer reads those ranges as plain text, never as special
// or added tokens, so a user typing "<|im_end|>" cannot forge a turn; only the markers the
// chat template itself writes become control tokens.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ms {

struct ByteRange {
  size_t begin, end;  // [begin, end)
  bool operator==(const ByteRange&) const = default;
};

struct MarkedText {
  std::string text;
  std::vector<ByteRange> untrusted;  // sorted, disjoint, non-empty, never adjacent

  // Appends s, all of it untrusted or all of it trusted.
  void append(std::string_view s, bool is_untrusted);
  // Appends s[begin, end), whose own untrusted ranges (offsets into s) are `marks`.
  void append(std::string_view s, const std::vector<ByteRange>& marks, size_t begin, size_t end);
  // True when any byte of [begin, end) is untrusted.
  bool overlaps_untrusted(size_t begin, size_t end) const;
};

// True when any byte of [begin, end) is in one of `marks` (sorted, disjoint).
bool overlaps(const std::vector<ByteRange>& marks, size_t begin, size_t end);

// The untrusted ranges of `marks` inside [begin, end), shifted so that `begin` is 0.
std::vector<ByteRange> marks_within(const std::vector<ByteRange>& marks, size_t begin, size_t end);

}  // namespace ms
