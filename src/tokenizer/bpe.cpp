#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>

namespace ms {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr size_t kCacheSlots = size_t(1) << 18;  // at most half of them are filled
constexpr size_t kCacheMaxWordBytes = 256;

uint64_t hash_word(std::string_view w) {
  uint64_t h = 0x243F6A8885A308D3ull ^ w.size();
  size_t i = 0;
  for (; i + 8 <= w.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, w.data() + i, 8);
    h = (h ^ v) * kGolden;
    h ^= h >> 32;
  }
  // The last 0..7 bytes, read with fixed-size loads (overlapping where needed).
  const auto* p = reinterpret_cast<const unsigned char*>(w.data() + i);
  size_t r = w.size() - i;
  uint64_t tail = 0;
  if (r >= 4) {
    uint32_t a, b;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + r - 4, 4);
    tail = (uint64_t(a) << 32) | b;
  } else if (r > 0) {
    tail = (uint64_t(p[0]) << 16) | (uint64_t(p[r / 2]) << 8) | p[r - 1];
  }
  h = (h ^ tail) * kGolden;
  h ^= h >> 29;
  return h | 1;  // never 0, which marks an empty slot
}

uint64_t pair_key(int left, int right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

}  // namespace

Bpe::Bpe(Options options) : opt_(std::move(options)) {
  size_t size = 16;
  shift_ = 60;
  while (size < opt_.merges.size() * 2) {
    size *= 2;
    --shift_;
  }
  table_.assign(size, Entry{kEmpty, 0, 0});
  // A pair listed twice keeps its last rank, as Hugging Face's map from pairs does.
  for (size_t rank = 0; rank < opt_.merges.size(); ++rank) {
    const Merge& m = opt_.merges[rank];
    uint64_t key = pair_key(m.left, m.right);
    size_t i = size_t((key * kGolden) >> shift_);
    while (table_[i].key != kEmpty && table_[i].key != key) i = (i + 1) & (size - 1);
    table_[i] = Entry{key, uint32_t(rank), m.result};
  }
}

const Bpe::Entry* Bpe::find_merge(int left, int right) const {
  uint64_t key = pair_key(left, right);
  size_t mask = table_.size() - 1;
  for (size_t i = size_t((key * kGolden) >> shift_);; i = (i + 1) & mask) {
    const Entry& e = table_[i];
    if (e.key == key) return &e;
    if (e.key == kEmpty) return nullptr;
  }
}

// Repeatedly applies the lowest-ranked merge among adjacent symbols, leftmost first on ties,
// through a heap of candidates that are checked for staleness when popped.
void Bpe::merge_word(std::string_view word, std::vector<int>& out) const {
  struct Symbol {
    int id, prev, next;
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int pos, result;
  };
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  syms.clear();
  heap.clear();

  bool prev_unk = false;
  for (unsigned char b : word) {
    int id = opt_.byte_ids[b];
    bool unk = id < 0;
    if (unk) {
      if (opt_.unk_id < 0 || (opt_.fuse_unk && prev_unk)) continue;
      id = opt_.unk_id;
    }
    prev_unk = unk;
    int n = int(syms.size());
    syms.push_back({id, n - 1, n + 1, true});
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  auto push = [&](int pos, int left, int right) {
    if (const Entry* m = find_merge(left, right)) {
      heap.push_back({m->rank, pos, m->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) push(int(i), syms[i].id, syms[i + 1].id);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    Candidate top = heap.back();
    heap.pop_back();
    Symbol& s = syms[size_t(top.pos)];
    if (!s.alive || s.next < 0) continue;
    Symbol& right = syms[size_t(s.next)];
    const Entry* m = find_merge(s.id, right.id);
    if (!m || m->result != top.result) continue;  // stale: one side has merged since
    s.id = top.result;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) syms[size_t(s.next)].prev = top.pos;
    if (s.prev >= 0) push(s.prev, syms[size_t(s.prev)].id, s.id);
    if (s.next >= 0) push(top.pos, s.id, syms[size_t(s.next)].id);
  }
  for (const Symbol& s : syms)
    if (s.alive) out.push_back(s.id);
}

void Bpe::encode_word(std::string_view word, std::vector<int>& out) const {
  if (word.size() == 1 && opt_.byte_ids[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(opt_.byte_ids[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (opt_.ignore_merges) {
    auto it = opt_.word_ids.find(word);
    if (it != opt_.word_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() > kCacheMaxWordBytes) {
    merge_word(word, out);
    return;
  }
  uint64_t hash = hash_word(word);
  if (cache_lookup(word, hash, out)) return;
  size_t first = out.size();
  merge_word(word, out);
  cache_insert(word, hash, out.data() + first, out.size() - first);
}

bool Bpe::slot_holds(const CacheSlot& s, std::string_view word, uint64_t hash) const {
  if (s.hash != hash || s.word_size != word.size()) return false;
  if (word.size() <= kInlineWord) return std::memcmp(s.word, word.data(), word.size()) == 0;
  uint32_t offset;
  std::memcpy(&offset, s.word, sizeof offset);
  return std::memcmp(cache_words_.data() + offset, word.data(), word.size()) == 0;
}

bool Bpe::cache_lookup(std::string_view word, uint64_t hash, std::vector<int>& out) const {
  std::lock_guard lock(cache_mutex_);
  if (cache_slots_.empty()) return false;
  size_t mask = cache_slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const CacheSlot& s = cache_slots_[i];
    if (s.hash == 0) return false;
    if (!slot_holds(s, word, hash)) continue;
    if (s.ids_size == 1)
      out.push_back(int(s.ids));
    else
      out.insert(out.end(), cache_ids_.begin() + s.ids, cache_ids_.begin() + s.ids + s.ids_size);
    return true;
  }
}

void Bpe::cache_insert(std::string_view word, uint64_t hash, const int* ids, size_t n) const {
  std::lock_guard lock(cache_mutex_);
  if (cache_slots_.empty()) cache_slots_.assign(kCacheSlots, CacheSlot{});
  if (cache_used_ >= kCacheSlots / 2) return;
  size_t mask = cache_slots_.size() - 1;
  size_t i = hash & mask;
  for (; cache_slots_[i].hash != 0; i = (i + 1) & mask)
    if (slot_holds(cache_slots_[i], word, hash)) return;  // another thread added it meanwhile
  CacheSlot s{};
  s.hash = hash;
  s.word_size = uint16_t(word.size());
  s.ids_size = uint16_t(n);
  if (word.size() <= kInlineWord) {
    std::memcpy(s.word, word.data(), word.size());
  } else {
    auto offset = uint32_t(cache_words_.size());
    std::memcpy(s.word, &offset, sizeof offset);
    cache_words_.append(word);
  }
  if (n == 1) {
    s.ids = uint32_t(ids[0]);
  } else {
    s.ids = uint32_t(cache_ids_.size());
    cache_ids_.insert(cache_ids_.end(), ids, ids + n);
  }
  cache_slots_[i] = s;
  ++cache_used_;
}

}  // namespace ms
