#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "util/error.h"

namespace ms {

namespace {

// Unicode White_Space, as the members of a character class.
constexpr std::string_view kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: one match data (only the whole match is read) and a JIT stack large
// enough for backtracking over long runs of white space.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::shared_ptr<const Code> code, std::string where)
    : code_(std::move(code)), where_(std::move(where)) {}

std::string Regex::from_oniguruma(std::string_view p) {
  std::string out;
  bool in_class = false;
  bool class_start = false;  // just after '[' or '[^': a ']' here is a literal
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      class_start = false;
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = class_start = true;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
    } else if (in_class && c == ']' && !class_start) {
      in_class = false;
    } else {
      class_start = false;
    }
  }
  return out;
}

Regex Regex::compile(std::string_view pattern, const std::string& where) {
  return build(from_oniguruma(pattern), PCRE2_UTF | PCRE2_UCP, where);
}

Regex Regex::literal(std::string_view text, const std::string& where) {
  return build(text, PCRE2_UTF | PCRE2_LITERAL, where);
}

Regex Regex::build(std::string_view pattern, uint32_t options, const std::string& where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                             &err, &offset, nullptr);
  if (!code->code)
    fail("{}: cannot compile pattern at offset {}: {} (pattern: {})", where, offset,
         pcre2_message(err), pattern);
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  return Regex(std::move(code), where);
}

bool Regex::find(std::string_view subject, size_t from, size_t* begin, size_t* end) const {
  ThreadMatchState& st = thread_state();
  auto s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = code_->jit ? pcre2_jit_match(code_->code, s, subject.size(), from, 0, st.data, st.context)
                      : pcre2_match(code_->code, s, subject.size(), from, PCRE2_NO_UTF_CHECK, st.data,
                                    st.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("{}: pattern match failed: {}", where_, pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace ms
