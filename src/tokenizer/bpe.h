#pragma once
// Byte-level BPE: a pre-tokenized word (raw bytes) becomes token ids by applying merges in
// rank order. Works on ids throughout: each byte starts as the id of its one-character
// token, and a merge (left id, right id) yields the id of the concatenation.
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ms {

class Bpe {
 public:
  struct Merge {
    int left, right, result;
  };
  // Hashes std::string keys and looks them up by std::string_view without a copy.
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using WordMap = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

  struct Options {
    std::array<int, 256> byte_ids;  // -1: the byte has no token
    std::vector<Merge> merges;      // by rank: merges[0] is applied first
    int unk_id = -1;                // stands for bytes without a token (-1: they are dropped)
    bool fuse_unk = false;
    // With ignore_merges, a word that is itself a token is that token (Llama-3 style).
    bool ignore_merges = false;
    WordMap word_ids;  // raw bytes -> id, for ignore_merges
  };

  explicit Bpe(Options options);

  // Appends the ids of one word. Thread-safe; repeated words come from a cache.
  void encode_word(std::string_view word, std::vector<int>& out) const;

 private:
  struct Entry {
    uint64_t key;  // (left << 32) | right; kEmpty marks a free slot
    uint32_t rank;
    int32_t result;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);

  const Entry* find_merge(int left, int right) const;
  void merge_word(std::string_view word, std::vector<int>& out) const;

  Options opt_;
  std::vector<Entry> table_;  // open addressing, power-of-two size
  int shift_ = 64;  // table index = (key * golden) >> shift_

  // Word -> its ids: open addressing over 32-byte slots. Short words and single ids (the
  // common case) sit in the slot itself, so a hit usually touches one cache line; longer ones
  // live in two arenas. Bounded: when half full, nothing more is added.
  static constexpr size_t kInlineWord = 16;
  struct CacheSlot {
    uint64_t hash;  // 0: empty
    char word[kInlineWord];  // the word (zero-padded) when it fits, else its arena offset
    uint32_t ids;  // the id when there is one, else the ids' arena offset
    uint16_t word_size, ids_size;
  };
  bool slot_holds(const CacheSlot& s, std::string_view word, uint64_t hash) const;
  bool cache_lookup(std::string_view word, uint64_t hash, std::vector<int>& out) const;
  void cache_insert(std::string_view word, uint64_t hash, const int* ids, size_t n) const;

  mutable std::mutex cache_mutex_;
  mutable std::vector<CacheSlot> cache_slots_;
  mutable std::string cache_words_;
  mutable std::vector<int> cache_ids_;
  mutable size_t cache_used_ = 0;
};

}  // namespace ms
