#pragma once
// The values a chat template computes with: Python's JSON-like types plus Jinja's undefined,
// namespaces and callables. Printing and comparison follow Python, since the reference output
// comes from Jinja2 running on Python.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tokenizer/marked_text.h"

namespace ms::jinja {

// What one render may build, so that no template or input exhausts memory or the stack.
// Real chat templates stay far below each (a conversation nests 4 deep, a tool schema ~10).
inline constexpr uint32_t kMaxNesting = 200;           // lists, dicts and namespaces inside each other
inline constexpr size_t kMaxStringBytes = size_t{64} << 20;  // one string
inline constexpr size_t kMaxItems = size_t{1} << 20;         // one list

struct Value;
using Array = std::vector<Value>;

// A dict that keeps insertion order, like Python's. Namespaces are the one mutable kind.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  bool untrusted_keys = false;  // the keys came from the request (see marked_text.h)
  uint32_t nesting = 1;         // 1 + the deepest value held; kept up to date by set()
  bool holds_untrusted = false; // some value held has untrusted text; kept up to date by set()

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(Args&)> call;
};

// What a missing variable, key or attribute evaluates to. Printing it gives "" and testing it
// gives false, as in Jinja2; anything more (an attribute, arithmetic) fails with `reason`.
struct Undefined {
  std::string reason;  // e.g. "'x' is undefined"
};

struct Value {
  using ArrayPtr = std::shared_ptr<const Array>;
  using ObjectPtr = std::shared_ptr<Object>;
  using FunctionPtr = std::shared_ptr<const Function>;
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, ArrayPtr, ObjectPtr,
               FunctionPtr>
      v;
  // Strings only: the byte ranges that came from the request; null when there are none.
  std::shared_ptr<const std::vector<ByteRange>> untrusted;
  // Arrays only: 1 + the deepest element, and whether any element holds untrusted text
  // (objects keep theirs in Object), so neither needs a walk over the elements.
  uint32_t array_nesting = 0;
  bool array_untrusted = false;

  Value() = default;
  Value(Undefined u) : v(std::move(u)) {}
  Value(std::nullptr_t) : v(nullptr) {}
  Value(bool b) : v(b) {}
  Value(int64_t i) : v(i) {}
  Value(int i) : v(int64_t{i}) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::move(s)) {}
  Value(const char* s) : v(std::string(s)) {}
  Value(Array a);  // fails beyond kMaxNesting
  Value(ObjectPtr o) : v(std::move(o)) {}
  Value(Function f) : v(std::make_shared<const Function>(std::move(f))) {}

  bool is_undefined() const { return std::holds_alternative<Undefined>(v); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<int64_t>(v); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_array() const { return std::holds_alternative<ArrayPtr>(v); }
  bool is_object() const { return std::holds_alternative<ObjectPtr>(v); }
  bool is_function() const { return std::holds_alternative<FunctionPtr>(v); }

  const std::string& str() const { return std::get<std::string>(v); }
  const Array& array() const { return *std::get<ArrayPtr>(v); }
  Object& object() const { return *std::get<ObjectPtr>(v); }
  const Function& function() const { return *std::get<FunctionPtr>(v); }
  // Bools count as integers, as in Python.
  int64_t as_int() const { return is_bool() ? int64_t{std::get<bool>(v)} : std::get<int64_t>(v); }
  double as_double() const { return is_float() ? std::get<double>(v) : double(as_int()); }
  // How deeply lists, dicts and namespaces nest in this value; 0 for a scalar.
  uint32_t nesting() const { return is_array() ? array_nesting : is_object() ? object().nesting : 0; }
};

// The nesting of a list or dict around values nesting `inner` deep; fails beyond kMaxNesting,
// naming `what` ("lists", "dicts").
uint32_t nesting_around(uint32_t inner, std::string_view what);
Value make_object(std::vector<std::pair<std::string, Value>> items = {});
// `untrusted`: every string (and dict key) in j came from the request.
Value from_json(const nlohmann::ordered_json& j, bool untrusted = false);

// ---- untrusted text (see tokenizer/marked_text.h) ----
// A string's untrusted ranges (empty for a trusted string or a non-string).
const std::vector<ByteRange>& marks(const Value& v);
// True when any string in v (deeply, dict keys included) holds untrusted bytes.
bool has_untrusted(const Value& v);
Value string_value(MarkedText m);
// A new string computed from others: all untrusted when `untrusted`, else trusted.
Value derived_string(std::string s, bool untrusted);
// Bytes [begin, end) of string s, keeping their marks.
Value substring(const Value& s, size_t begin, size_t end);
// Appends str(v): a string with its marks, anything else marked whole if it holds untrusted text.
void append_str(MarkedText& out, const Value& v);
// Key k of o as a value, untrusted when o's keys came from the request.
Value key_value(const Object& o, const std::string& k);
// Fails when a string of n bytes would exceed kMaxStringBytes.
void check_string_size(size_t n, std::string_view what);

// Python's type name of a value ("str", "dict", ...), for error messages.
std::string type_name(const Value& v);
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// <0, 0, >0 like Python's ordering of numbers, strings and lists; fails on other pairs.
int compare(const Value& a, const Value& b);

// str(v) and repr(v) as Python prints them.
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
std::string float_repr(double d);
// repr(v) for an error message: a scalar or a short string in full, a long string cut, a
// list or dict by its type and length (never its contents).
std::string repr_for_error(const Value& v);

// json.dumps(v, ensure_ascii=False, indent=indent, separators=...) as transformers' tojson
// filter calls it; indent < 0 means None (one line).
std::string to_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep,
                    bool sort_keys);

// Unicode helpers over UTF-8 text (Python indexes strings by code point).
// Decodes the code point at s[i] and advances i; a malformed byte decodes as itself (Latin-1).
char32_t next_code_point(std::string_view s, size_t& i);
std::vector<std::string> code_points(std::string_view s);
bool is_py_space(char32_t c);

}  // namespace ms::jinja
