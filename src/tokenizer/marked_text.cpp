#include "tokenizer/marked_text.h"

#include <algorithm>

namespace ms {
namespace {

// Adds [begin, end) at the end of `ranges`, merging it with the last range when they touch.
void push_range(std::vector<ByteRange>& ranges, size_t begin, size_t end) {
  if (begin >= end) return;
  if (!ranges.empty() && ranges.back().end >= begin) {
    ranges.back().end = std::max(ranges.back().end, end);
    return;
  }
  ranges.push_back({begin, end});
}

// The first range that ends after `pos`.
std::vector<ByteRange>::const_iterator first_ending_after(const std::vector<ByteRange>& marks, size_t pos) {
  return std::upper_bound(marks.begin(), marks.end(), pos, [](size_t p, const ByteRange& r) { return p < r.end; });
}

}  // namespace

void MarkedText::append(std::string_view s, bool is_untrusted) {
  if (is_untrusted) push_range(untrusted, text.size(), text.size() + s.size());
  text += s;
}

void MarkedText::append(std::string_view s, const std::vector<ByteRange>& marks, size_t begin, size_t end) {
  const size_t base = text.size();
  for (auto it = first_ending_after(marks, begin); it != marks.end() && it->begin < end; ++it)
    push_range(untrusted, base + std::max(it->begin, begin) - begin, base + std::min(it->end, end) - begin);
  text.append(s.substr(begin, end - begin));
}

bool MarkedText::overlaps_untrusted(size_t begin, size_t end) const { return overlaps(untrusted, begin, end); }

bool overlaps(const std::vector<ByteRange>& marks, size_t begin, size_t end) {
  auto it = first_ending_after(marks, begin);
  return it != marks.end() && it->begin < end;
}

std::vector<ByteRange> marks_within(const std::vector<ByteRange>& marks, size_t begin, size_t end) {
  std::vector<ByteRange> out;
  for (auto it = first_ending_after(marks, begin); it != marks.end() && it->begin < end; ++it)
    push_range(out, std::max(it->begin, begin) - begin, std::min(it->end, end) - begin);
  return out;
}

}  // namespace ms
