#pragma once
// Constrained decoding to one JSON object (response_format {"type": "json_object"}): a pushdown
// acceptor of JSON text (RFC 8259) fed byte by byte, and the tokens that may come next, those
// whose bytes keep the text a prefix of one JSON object; end-of-sequence only once the object is
// complete, and nothing else after it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ms {

class Tokenizer;

// Whether a text is a prefix of a JSON object that starts at its first byte, fed byte by byte.
class JsonAcceptor {
 public:
  static constexpr int kMaxDepth = 64;     // nesting past this is refused
  // Whitespace between tokens, at most this many bytes in a row: a model that prefers it would
  // otherwise fill max_tokens with it (llama.cpp's JSON grammar bounds it too).
  static constexpr int kMaxSpaceRun = 16;

  // Takes one more byte; false (and the state unchanged) when no JSON object text goes on so.
  bool feed(char c);
  bool feed(std::string_view s);  // every byte, or false at the first that does not fit
  // The top-level object is closed: only whitespace may follow.
  bool complete() const { return state_ == State::Done; }

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
    Minus, Zero, Int, Dot, Frac, Exp, ExpSign, ExpDigits,  // a number, by its grammar's states
    Literal,        // inside true, false or null: literal_ holds what is left
    Done,
  };
  bool after_value();            // a value ended: where the container goes on
  bool begin_value(char c);      // c starts a value
  bool end_number(char c);       // c ends a number and goes on in the container
  bool step(char c);             // feed() less the whitespace bound
  static bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  State state_ = State::Start;
  std::string stack_;            // '{' or '[' per open container
  bool key_ = false;             // the string being read is an object key
  int hex_ = 0;
  int space_run_ = 0;            // whitespace bytes between tokens just taken
  std::string_view literal_;
};

// Which tokens may come next under a JsonAcceptor: allowed[id] = 1 for each token whose bytes it
// takes, the end-of-sequence ids only once the object is complete (and then nothing else);
// special tokens never otherwise.
class JsonConstraint {
 public:
  JsonConstraint(const Tokenizer& tok, std::vector<int> eos_ids);
  // The mask of the next pick ([vocab]).
  const std::vector<uint8_t>& allowed();
  // A token was accepted: its bytes go into the acceptor (an end-of-sequence id changes nothing).
  void accept(int id);
  bool complete() const { return acceptor_.complete(); }

 private:
  const Tokenizer& tok_;
  std::vector<int> eos_;
  JsonAcceptor acceptor_;
  std::vector<uint8_t> mask_;
};

}  // namespace ms
