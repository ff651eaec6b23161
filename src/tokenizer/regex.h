#pragma once
// A compiled PCRE2 pattern (UTF + UCP, JIT where available) for the pre-tokenizer's Split.
// tokenizer.json patterns are written for Oniguruma, which Hugging Face uses; the few places
// where the two engines read the same pattern differently are rewritten (see from_oniguruma).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ms {

class Regex {
 public:
  // `where` names the pattern's origin (file and field) for the error a bad pattern gets.
  static Regex compile(std::string_view pattern, const std::string& where);
  static Regex literal(std::string_view text, const std::string& where);

  // Finds the first match in subject[from..]; the subject must be valid UTF-8 (not rechecked).
  // Lookarounds see the whole subject. Returns false when there is none.
  bool find(std::string_view subject, size_t from, size_t* begin, size_t* end) const;

  // Oniguruma's \s is Unicode White_Space; PCRE2's also takes U+180E. Spells \s and \S out.
  static std::string from_oniguruma(std::string_view pattern);

 private:
  struct Code;
  static Regex build(std::string_view pattern, uint32_t options, const std::string& where);
  Regex(std::shared_ptr<const Code> code, std::string where);
  std::shared_ptr<const Code> code_;
  std::string where_;
};

}  // namespace ms
