#include "chat/json_constraint.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "chat/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace ms {

using json_text::space;

bool JsonAcceptor::after_value() {
  if (stack_.empty()) {
    state_ = State::Done;
  } else {
    state_ = State::CommaOrEnd;
  }
  return true;
}

bool JsonAcceptor::begin_value(char c) {
  switch (c) {
    case '{':
    case '[':
      if (int(stack_.size()) >= kMaxDepth) return false;
      stack_ += c;
      state_ = c == '{' ? State::KeyOrEnd : State::ValueOrEnd;
      return true;
    case '"': state_ = State::String, key_ = false; return true;
    case 't': state_ = State::Literal, literal_ = "rue"; return true;
    case 'f': state_ = State::Literal, literal_ = "alse"; return true;
    case 'n': state_ = State::Literal, literal_ = "ull"; return true;
    default:
      number_ = json_text::number_start(c);
      if (number_ < 0) return false;
      state_ = State::Number;
      return true;
  }
}

// A number ends at the first byte that cannot continue it: that byte then goes on as it would
// after any value (inside a container: the top level is an object).
bool JsonAcceptor::end_number(char c) {
  const State saved = state_;
  after_value();
  if (step(c)) return true;
  state_ = saved;
  return false;
}

bool JsonAcceptor::feed(char c) {
  const bool in_string = state_ == State::String || state_ == State::Escape || state_ == State::Unicode;
  if (space(c) && !in_string) {
    int run = space_run_;
    if (!gap_space(run, c) || !step(c)) return false;
    space_run_ = run;
    return true;
  }
  if (!step(c)) return false;
  space_run_ = 0;
  return true;
}

bool JsonAcceptor::step(char c) {
  switch (state_) {
    case State::Start:  // the answer starts with its '{'
      if (c != '{') return false;
      stack_ = "{";
      state_ = State::KeyOrEnd;
      return true;
    case State::KeyOrEnd:
    case State::Key:
      if (space(c)) return true;
      if (c == '"') {
        state_ = State::String, key_ = true;
        return true;
      }
      if (c == '}' && state_ == State::KeyOrEnd) {
        stack_.pop_back();
        return after_value();
      }
      return false;
    case State::Colon:
      if (space(c)) return true;
      if (c != ':') return false;
      state_ = State::Value;
      return true;
    case State::Value:
      if (space(c)) return true;
      return begin_value(c);
    case State::ValueOrEnd:
      if (space(c)) return true;
      if (c == ']') {
        stack_.pop_back();
        return after_value();
      }
      return begin_value(c);
    case State::CommaOrEnd:
      if (space(c)) return true;
      if (c == ',') {
        state_ = stack_.back() == '{' ? State::Key : State::Value;
        return true;
      }
      if (c == (stack_.back() == '{' ? '}' : ']')) {
        stack_.pop_back();
        return after_value();
      }
      return false;
    case State::String:
      if (c == '"') {
        if (key_) {
          state_ = State::Colon;
          return true;
        }
        return after_value();
      }
      if (c == '\\') {
        state_ = State::Escape;
        return true;
      }
      return uint8_t(c) >= 0x20;  // control characters must be escaped
    case State::Escape:
      if (c == 'u') {
        state_ = State::Unicode, hex_ = 4;
        return true;
      }
      if (!json_text::escape(c)) return false;
      state_ = State::String;
      return true;
    case State::Unicode:
      if (!json_text::hex_digit(c)) return false;
      if (--hex_ == 0) state_ = State::String;
      return true;
    case State::Number: {
      const int next = json_text::number_next(number_, c, false);
      if (next >= 0) {
        number_ = next;
        return true;
      }
      return json_text::number_final(number_) && end_number(c);
    }
    case State::Literal:
      if (c != literal_.front()) return false;
      literal_.remove_prefix(1);
      if (literal_.empty()) return after_value();
      return true;
    case State::Done:
      return space(c);
  }
  return false;
}

std::string JsonAcceptor::key() const {
  std::string k = {char(state_), char(key_), char(hex_), char(state_ == State::Number ? number_ : 0), char(space_run_)};
  return k.append(literal_).append(1, '\0').append(stack_);
}

bool JsonAcceptor::feed(std::string_view s) {
  for (char c : s)
    if (!feed(c)) return false;
  return true;
}

ToolCallAcceptor::ToolCallAcceptor(std::vector<std::string> names, std::vector<std::shared_ptr<const JsonSchema>> schemas)
    : schemas_(std::move(schemas)) {
  schemas_.resize(names.size());
  auto prefixes = std::make_shared<std::vector<std::string>>();
  for (const std::string& n : names) prefixes->push_back("<tool_call>\n{\"name\": \"" + n + "\", \"arguments\": ");
  prefixes_ = std::move(prefixes);
}

bool ToolCallAcceptor::feed(char c) {
  static constexpr std::string_view kSuffix = "}\n</tool_call>";
  switch (phase_) {
    case Phase::Prefix: {
      const std::string next = text_ + c;
      bool any = false, whole = false;
      for (const std::string& p : *prefixes_)
        if (p.compare(0, next.size(), next) == 0) any = true, whole |= p.size() == next.size();
      if (!any) return false;
      text_ = next;
      if (whole) {
        for (size_t i = 0; i < prefixes_->size(); ++i)
          if ((*prefixes_)[i] == text_ && schemas_[i]) strict_.emplace(schemas_[i]);
        phase_ = Phase::Arguments, text_.clear();
      }
      return true;
    }
    case Phase::Arguments:
      if (!arguments_feed(c)) return false;
      if (arguments_complete()) phase_ = Phase::Suffix;
      return true;
    case Phase::Suffix:
      if (kSuffix[text_.size()] != c) return false;
      text_ += c;
      if (text_.size() == kSuffix.size()) phase_ = Phase::Done;
      return true;
    case Phase::Done:
      return false;
  }
  return false;
}

bool ToolCallAcceptor::arguments_feed(char c) { return strict_ ? strict_->feed(c) : arguments_.feed(c); }

bool ToolCallAcceptor::arguments_complete() const { return strict_ ? strict_->complete() : arguments_.complete(); }

bool ToolCallAcceptor::in_string() const {
  return phase_ == Phase::Arguments && (strict_ ? strict_->in_string() : arguments_.in_string());
}

std::string ToolCallAcceptor::key() const {
  return char(phase_) + text_ + '\0' + (strict_ ? "S" + strict_->key() : arguments_.key());
}

bool ToolCallAcceptor::feed(std::string_view s) {
  for (char c : s)
    if (!feed(c)) return false;
  return true;
}

namespace {
constexpr std::string_view kToolCallOpen = "<tool_call>";
}  // namespace

AutoToolAcceptor::AutoToolAcceptor(std::vector<std::string> names, std::vector<std::shared_ptr<const JsonSchema>> schemas)
    : fresh_(std::make_shared<const ToolCallAcceptor>(std::move(names), std::move(schemas))) {}

bool AutoToolAcceptor::feed(char c) {
  if (call_) {
    if (!call_->feed(c)) return false;
    if (call_->complete()) call_.reset(), marker_ = 0;
    return true;
  }
  // No proper prefix of "<tool_call>" is also its suffix: a mismatch starts over at '<'.
  marker_ = c == kToolCallOpen[marker_] ? marker_ + 1 : c == kToolCallOpen[0] ? 1 : 0;
  if (marker_ == kToolCallOpen.size()) {
    call_.emplace(*fresh_);
    call_->feed(kToolCallOpen);
  }
  return true;
}

bool AutoToolAcceptor::feed(std::string_view s) {
  for (char c : s)
    if (!feed(c)) return false;
  return true;
}

std::string AutoToolAcceptor::key() const { return call_ ? "C" + call_->key() : "F" + std::to_string(marker_); }

namespace {

// The trie of `ids` (sorted by their bytes, so that a node's children come in order and tokens of
// equal bytes together).
TokenTries::Trie build_trie(const Tokenizer& tok, std::vector<int> ids) {
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return tok.token_text(a) < tok.token_text(b); });
  TokenTries::Trie t;
  t.nodes.emplace_back();
  std::vector<int> last_child(1, -1);
  for (size_t i = 0; i < ids.size(); ++i) {
    int node = 0;
    for (char ch : tok.token_text(ids[i])) {
      const uint8_t b = uint8_t(ch);
      const int last = last_child[size_t(node)];
      if (last >= 0 && t.nodes[size_t(last)].byte == b) {
        node = last;
        continue;
      }
      const int child = int(t.nodes.size());
      t.nodes.push_back({.byte = b});
      last_child.push_back(-1);
      if (last >= 0) t.nodes[size_t(last)].next_sibling = child;
      else t.nodes[size_t(node)].first_child = child;
      last_child[size_t(node)] = child;
      node = child;
    }
    TokenTries::Node& n = t.nodes[size_t(node)];
    if (n.tokens_end == 0) n.tokens_begin = int(i);
    n.tokens_end = int(i) + 1;
  }
  t.ids = std::move(ids);
  return t;
}

}  // namespace

std::shared_ptr<const TokenTries> token_tries(const Tokenizer& tok) {
  // By tokenizer: an entry lives while a constraint holds it, and a constraint does not outlive
  // its tokenizer, so an address is not reused while its entry lives.
  static std::mutex mu;
  static std::unordered_map<const Tokenizer*, std::weak_ptr<const TokenTries>> cache;
  std::lock_guard lk(mu);
  if (auto t = cache[&tok].lock()) return t;
  auto t = std::make_shared<TokenTries>();
  std::vector<int> all, strings;
  t->plain.assign(size_t(tok.vocab_size()), 0);
  for (int id = 0; id < tok.vocab_size(); ++id) {
    const std::string& bytes = tok.token_text(id);
    if (tok.is_special(id) || bytes.empty()) continue;
    all.push_back(id);
    const bool plain = std::all_of(bytes.begin(), bytes.end(), json_text::plain_string_byte);
    t->plain[size_t(id)] = plain;
    if (!plain) strings.push_back(id);
  }
  t->all = build_trie(tok, std::move(all));
  t->strings = build_trie(tok, std::move(strings));
  cache[&tok] = t;
  return t;
}

template <class Acceptor>
TokenConstraint<Acceptor>::TokenConstraint(const Tokenizer& tok, std::vector<int> eos_ids, Acceptor acceptor)
    : tok_(tok), eos_(std::move(eos_ids)), acceptor_(std::move(acceptor)), tries_(token_tries(tok)) {}

template <class Acceptor>
void TokenConstraint<Acceptor>::walk(const TokenTries::Trie& trie, int node, size_t depth, std::vector<uint8_t>& mask) {
  if (stack_.size() <= depth + 1) stack_.resize(depth + 2);
  for (int c = trie.nodes[size_t(node)].first_child; c >= 0; c = trie.nodes[size_t(c)].next_sibling) {
    const TokenTries::Node& n = trie.nodes[size_t(c)];
    std::optional<Acceptor>& next = stack_[depth + 1];
    next = stack_[depth];  // assigned: the buffers of the last walk at this depth are reused
    if (!next->feed(char(n.byte))) continue;
    for (int i = n.tokens_begin; i < n.tokens_end; ++i) mask[size_t(trie.ids[size_t(i)])] = 1;
    walk(trie, c, depth + 1, mask);
  }
}

template <class Acceptor>
const std::vector<uint8_t>& TokenConstraint<Acceptor>::allowed() {
  std::string key = acceptor_.key();
  if (auto it = masks_.find(key); it != masks_.end()) return it->second;
  if (masks_.size() >= kCachedMasks) masks_.clear();
  std::vector<uint8_t>& mask = masks_[std::move(key)];
  const bool done = acceptor_.complete();
  bool closed = done;  // nothing may follow
  if constexpr (requires { Acceptor::kGoesOnWhenComplete; }) closed = false;
  const int vocab = tok_.vocab_size();
  mask.assign(size_t(vocab), 0);
  if (!closed) {
    const bool in_string = acceptor_.in_string();
    if (in_string) mask = tries_->plain;
    if (stack_.empty()) stack_.resize(1);
    stack_[0] = acceptor_;
    walk(in_string ? tries_->strings : tries_->all, 0, 0, mask);
  }
  for (int id : eos_)
    if (id >= 0 && id < vocab) mask[size_t(id)] = done ? 1 : 0;
  return mask;
}

template <class Acceptor>
void TokenConstraint<Acceptor>::accept(int id) {
  if (std::find(eos_.begin(), eos_.end(), id) != eos_.end()) return;
  acceptor_.feed(tok_.token_text(id));
}

template class TokenConstraint<JsonAcceptor>;
template class TokenConstraint<ToolCallAcceptor>;
template class TokenConstraint<AutoToolAcceptor>;
template class TokenConstraint<SchemaAcceptor>;

}  // namespace ms
