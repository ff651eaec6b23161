#pragma once
// Constrained decoding: acceptors of the answer's text fed byte by byte (one JSON object, RFC
// 8259, for response_format {"type": "json_object"}; one tool call for a forced tool_choice; free
// text whose tool calls are held to their form and strict tools' schemas), and
// the tokens that may come next, those whose bytes keep the text a prefix of what the acceptor
// takes; end-of-sequence only once it is complete, and nothing else after it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/json_schema.h"

namespace ms {

class Tokenizer;

// Whether a text is a prefix of a JSON object that starts at its first byte, fed byte by byte.
class JsonAcceptor {
 public:
  static constexpr int kMaxDepth = 64;  // nesting past this is refused
  // Whitespace between tokens: as gap_space (chat/json_schema.h) allows.

  // Takes one more byte; false (and the state unchanged) when no JSON object text goes on so.
  bool feed(char c);
  bool feed(std::string_view s);  // every byte, or false at the first that does not fit
  // The top-level object is closed: only whitespace may follow.
  bool complete() const { return state_ == State::Done; }
  // What decides which bytes come next, as a key: equal keys take the same texts.
  std::string key() const;
  // Inside a string (not an escape): any bytes but '"', '\\' and control characters keep it so.
  bool in_string() const { return state_ == State::String; }

 private:
  enum class State : uint8_t {
    Start,          // the top-level '{' comes first
    KeyOrEnd,       // after '{': a key or '}'
    Key,            // after ',' in an object: a key
    Colon,          // after a key
    Value,          // after ':' or ',' in an array: a value
    ValueOrEnd,     // after '[': a value or ']'
    CommaOrEnd,     // after a value inside an object or array
    String,         // inside a string (key or value: key_ says which)
    Escape,         // after '\' in a string
    Unicode,        // in \uXXXX: hex_ digits left
    Number,         // inside a number: number_ is its grammar's state (json_text::NumberState)
    Literal,        // inside true, false or null: literal_ holds what is left
    Done,
  };
  bool after_value();            // a value ended: where the container goes on
  bool begin_value(char c);      // c starts a value
  bool end_number(char c);       // c ends a number and goes on in the container
  bool step(char c);             // feed() less the whitespace bound

  State state_ = State::Start;
  std::string stack_;            // '{' or '[' per open container
  bool key_ = false;             // the string being read is an object key
  int hex_ = 0;
  int number_ = 0;
  int space_run_ = 0;            // the gap between tokens so far (gap_space)
  std::string_view literal_;
};

// One tool call in the Hermes/Qwen form chat/tool_calls.h parses, to one of `names`:
//   <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
// (tool_choice "required" or a named function), fed byte by byte. The arguments are a JSON object,
// one that validates against the tool's schema where `schemas` has one (a strict tool's).
class ToolCallAcceptor {
 public:
  explicit ToolCallAcceptor(std::vector<std::string> names,
                            std::vector<std::shared_ptr<const JsonSchema>> schemas = {});
  bool feed(char c);
  bool feed(std::string_view s);
  bool complete() const { return phase_ == Phase::Done; }
  std::string key() const;
  bool in_string() const;

 private:
  enum class Phase : uint8_t { Prefix, Arguments, Suffix, Done };
  bool arguments_feed(char c);
  bool arguments_complete() const;

  std::shared_ptr<const std::vector<std::string>> prefixes_;  // one a name: the text up to the arguments
  std::vector<std::shared_ptr<const JsonSchema>> schemas_;    // by name; null: any JSON object
  Phase phase_ = Phase::Prefix;
  std::string text_;  // of the prefix or suffix so far
  JsonAcceptor arguments_;
  std::optional<SchemaAcceptor> strict_;  // the arguments of a tool with a schema
};

// Free text (tool_choice "auto") in which each tool call the model opens with "<tool_call>" is
// held to ToolCallAcceptor's form: one of `names`, a strict tool's arguments validating against
// its schema (`schemas`, by name; null: any JSON object). Outside a call any byte goes; the text
// is complete (end-of-sequence allowed) anywhere outside a call.
class AutoToolAcceptor {
 public:
  AutoToolAcceptor(std::vector<std::string> names, std::vector<std::shared_ptr<const JsonSchema>> schemas);
  bool feed(char c);
  bool feed(std::string_view s);
  bool complete() const { return !call_; }
  static constexpr bool kGoesOnWhenComplete = true;  // complete text may still go on
  std::string key() const;
  bool in_string() const { return call_ && call_->in_string(); }

 private:
  std::shared_ptr<const ToolCallAcceptor> fresh_;  // a call's acceptor before its first byte
  std::optional<ToolCallAcceptor> call_;           // inside a call
  size_t marker_ = 0;  // bytes of "<tool_call>" that end the free text so far
};

// What a pick may make next under a constraint on the answer's text ([vocab] mask), and the
// tokens it made.
class PickConstraint {
 public:
  virtual ~PickConstraint() = default;
  virtual const std::vector<uint8_t>& allowed() = 0;
  virtual void accept(int id) = 0;
};

// The tokens a pick may make (not special, not empty) as tries of their bytes, built once per
// tokenizer and shared (token_tries): a mask walks a trie with the acceptor, feeding each shared
// prefix once and leaving a branch at the first byte the acceptor refuses. `strings` holds only
// the tokens with a '"', '\\' or control byte: the others (`plain`) are taken untried inside a
// string.
struct TokenTries {
  struct Node {
    int first_child = -1, next_sibling = -1;
    int tokens_begin = 0, tokens_end = 0;  // into ids: the tokens whose bytes end here
    uint8_t byte = 0;
  };
  struct Trie {
    std::vector<Node> nodes;  // [0]: the root (no bytes)
    std::vector<int> ids;
  };
  Trie all, strings;
  std::vector<uint8_t> plain;  // [vocab]
};
std::shared_ptr<const TokenTries> token_tries(const Tokenizer& tok);

// The tokens an acceptor of bytes (JsonAcceptor, ToolCallAcceptor, ...) takes next: allowed[id] =
// 1 for each token whose bytes it takes, the end-of-sequence ids only once its text is complete
// (and then nothing else, but where the acceptor's kGoesOnWhenComplete says complete text may go
// on); special tokens never otherwise. Masks are kept by the acceptor's
// key() (a JSON answer's states recur: inside a string, after a value at the same depth), at
// most kCachedMasks of them; a new one walks the vocabulary's trie (TokenTries), and inside a
// string takes the tokens of plain string bytes without trying them.
template <class Acceptor>
class TokenConstraint final : public PickConstraint {
 public:
  TokenConstraint(const Tokenizer& tok, std::vector<int> eos_ids, Acceptor acceptor);
  const std::vector<uint8_t>& allowed() override;
  // A token was accepted: its bytes go into the acceptor (an end-of-sequence id changes nothing).
  void accept(int id) override;
  bool complete() const { return acceptor_.complete(); }

 private:
  static constexpr size_t kCachedMasks = 64;
  // Sets mask[id] for the tokens below `node` of `trie` that the acceptor at stack_[depth] takes.
  void walk(const TokenTries::Trie& trie, int node, size_t depth, std::vector<uint8_t>& mask);
  const Tokenizer& tok_;
  std::vector<int> eos_;
  Acceptor acceptor_;
  std::unordered_map<std::string, std::vector<uint8_t>> masks_;
  std::shared_ptr<const TokenTries> tries_;
  std::vector<std::optional<Acceptor>> stack_;  // a walk's acceptor at each depth, reused
};

using JsonConstraint = TokenConstraint<JsonAcceptor>;
using ToolCallConstraint = TokenConstraint<ToolCallAcceptor>;
using AutoToolConstraint = TokenConstraint<AutoToolAcceptor>;
using SchemaConstraint = TokenConstraint<SchemaAcceptor>;  // chat/json_schema.h

}  // namespace ms
