#pragma once
// Added tokens (special or not) are found in the text before pre-tokenization and become
// their own id; the text between them goes on to the BPE model. Matching is leftmost-longest,
// with each token's single_word / lstrip / rstrip flags as Hugging Face applies them.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/marked_text.h"

namespace ms {

struct AddedToken {
  int id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;  // the match takes the white space before it
  bool rstrip = false;  // the match takes the white space after it
  bool normalized = false;
  bool special = false;
};

class AddedTokenMatcher {
 public:
  void add(const AddedToken& token);
  bool empty() const { return tokens_.empty(); }

  struct Piece {
    size_t begin, end;
    int id;  // -1: plain text
  };
  // Splits valid UTF-8 text into plain-text pieces and added tokens, covering all of it.
  // Empty plain-text pieces are left out. A token is matched only where none of its bytes
  // is in `untrusted` (sorted, disjoint ranges): there its text stays plain text.
  void split(std::string_view text, std::vector<Piece>& out, const std::vector<ByteRange>& untrusted = {}) const;

 private:
  // The longest token starting at text[pos] whose bytes are all trusted, or nullptr.
  const AddedToken* longest_at(std::string_view text, size_t pos, const std::vector<ByteRange>& untrusted) const;

  std::vector<AddedToken> tokens_;
  std::array<std::vector<size_t>, 256> by_first_byte_;  // indices into tokens_, longest first
};

}  // namespace ms
