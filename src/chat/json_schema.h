#pragma once
// JSON schemas for constrained decoding (response_format json_schema): the subset OpenAI's strict
// mode takes, compiled into nodes, and an acceptor of the JSON texts that validate, fed byte by
// byte (chat/json_constraint.h's TokenConstraint masks a pick with it).
//
// Taken: type (one or a list), properties, required, additionalProperties (the answer has only the
// declared properties, in their order, which validates either way), items, enum, const, anyOf,
// $defs / definitions with "#/$defs/NAME" $refs (recursion included), and description, title,
// strict, $schema, $id, default as annotations. Refused with a SchemaError naming the keyword and
// where it is: every other keyword (pattern, format, minimum, oneOf, ...), a schema without a type,
// enum, const or anyOf, and a $ref elsewhere.
#include <nlohmann/json.hpp>

#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ms {

// Whitespace between a constrained answer's tokens, as llama.cpp's JSON grammar bounds it: one
// space, or a newline and at most kMaxIndent spaces or tabs. `run` counts the gap's bytes so far
// (0 at a token); whether c may come next in the gap, and if so run counts it. A model that likes
// whitespace would otherwise fill max_tokens with it.
inline constexpr int kMaxIndent = 8;
inline bool gap_space(int& run, char c) {
  if (run == 0 && (c == ' ' || c == '\n')) return run = c == ' ' ? kMaxIndent + 2 : 1, true;
  if (run >= 1 && run <= kMaxIndent && (c == ' ' || c == '\t')) return ++run, true;
  return false;
}

// Pieces of JSON text (RFC 8259) both acceptors (JsonAcceptor, SchemaAcceptor) read alike.
namespace json_text {

inline bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool hex_digit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
inline bool escape(char c) { return std::string_view("\"\\/bfnrt").find(c) != std::string_view::npos; }  // after '\\'
// A byte a string takes as itself: not '"', '\\' or a control character.
inline bool plain_string_byte(char c) { return c != '"' && c != '\\' && uint8_t(c) >= 0x20; }

// A number's grammar states: after '-', '0', digits, '.', fraction digits, 'e', the exponent's
// sign, its digits. A number may end in the final ones.
enum NumberState { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };
inline bool number_final(int s) { return s == kZero || s == kInt || s == kFrac || s == kExpDigits; }

// The state of a number's first byte c, or -1 where c starts none.
inline int number_start(char c) { return c == '-' ? kMinus : c == '0' ? kZero : (c >= '1' && c <= '9') ? kInt : -1; }

// The state after c, or -1 where c does not go on the number (an integer has no '.' or exponent).
inline int number_next(int s, char c, bool integer) {
  const bool digit = c >= '0' && c <= '9';
  switch (s) {
    case kMinus: return c == '0' ? kZero : digit ? kInt : -1;
    case kZero:
    case kInt:
      if (digit && s == kInt) return kInt;
      if (integer) return -1;
      if (c == '.') return kDot;
      return c == 'e' || c == 'E' ? kExp : -1;
    case kDot: return digit ? kFrac : -1;
    case kFrac:
      if (digit) return kFrac;
      return c == 'e' || c == 'E' ? kExp : -1;
    case kExp:
      if (c == '+' || c == '-') return kExpSign;
      return digit ? kExpDigits : -1;
    case kExpSign:
    case kExpDigits: return digit ? kExpDigits : -1;
  }
  return -1;
}

}  // namespace json_text

struct SchemaError : std::runtime_error {
  SchemaError(std::string path, const std::string& message) : std::runtime_error(message), path(std::move(path)) {}
  std::string path;  // where in the schema, e.g. "properties.point.pattern"
};

struct SchemaNode {
  // boolean and null compile to Literals ("true", "false"; "null").
  enum class Kind : uint8_t { Object, Array, String, Number, Integer, Literals, AnyOf };
  Kind kind = Kind::String;
  std::vector<std::pair<std::string, const SchemaNode*>> properties;  // Object: JSON-escaped names, in order
  std::vector<bool> required;                                         // Object: per property
  const SchemaNode* items = nullptr;                                  // Array
  std::vector<std::string> literals;                                  // Literals (enum, const): JSON texts
  std::vector<const SchemaNode*> alternatives;                        // AnyOf
};

class JsonSchema {
 public:
  // Throws SchemaError where the schema has what the acceptor cannot hold to.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::ordered_json& schema);
  const SchemaNode* root() const { return root_; }

 private:
  std::deque<SchemaNode> nodes_;  // stable addresses
  const SchemaNode* root_ = nullptr;
  friend class SchemaCompiler;
};

// Whether a text is a prefix of a JSON text that validates against the schema (the root value
// starting at the first byte, whitespace between tokens as gap_space allows, the properties of an
// object in their declared order), fed byte by byte. Several readings are followed at once where the
// schema allows them (anyOf, enum values that extend each other).
class SchemaAcceptor {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr size_t kMaxReadings = 64;

  explicit SchemaAcceptor(std::shared_ptr<const JsonSchema> schema);
  bool feed(char c);  // false (the state unchanged) where no validating text goes on so
  bool feed(std::string_view s);
  bool complete() const;  // some reading holds a whole root value
  std::string key() const;
  // Every reading is inside a string value (not an escape): plain bytes keep it so.
  bool in_string() const;

 private:
  enum class Phase : uint8_t {
    Value,      // a value of the frame's node comes (whitespace first)
    ObjOpen,    // after '{': a key or '}'
    ObjComma,   // after ',' in an object: a key
    ObjKey,     // inside a key: text holds its bytes so far
    ObjColon,   // after a key
    ObjNext,    // after a member's value: ',' or '}'
    ArrOpen,    // after '[': a value or ']'
    ArrNext,    // after an element: ',' or ']'
    String,     // inside a string value
    Escape,     // after '\'
    Unicode,    // in \uXXXX (index: digits left)
    Number,     // inside a number (index: its grammar's state)
    Literal,    // inside a literal (text: what has been read; node: its candidates)
  };
  struct Frame {
    const SchemaNode* node;
    Phase phase;
    int index = 0;     // Obj*: the next property that may come (ObjColon: the key's); Number: state; Unicode: digits left
    std::string text;  // ObjKey / Literal: bytes read
  };
  struct Reading {
    std::vector<Frame> stack;  // empty once the root value is done
    int space_run = 0;
    bool done = false;
  };
  void step(const Reading& r, char c, std::vector<Reading>& out) const;
  void value_done(Reading r, std::vector<Reading>& out) const;  // the top frame's value ended
  void start_value(Reading r, const SchemaNode* node, char c, std::vector<Reading>& out) const;

  std::shared_ptr<const JsonSchema> schema_;
  std::vector<Reading> readings_;
};

}  // namespace ms
