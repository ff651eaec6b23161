#pragma once
// Jinja2's filters, tests, Python methods on str/dict, and item/attribute access, for the
// subset of Jinja2 chat templates use. Failures throw ms::Error without a line number; the
// renderer adds the line.
#include <optional>
#include <string>
#include <string_view>

#include "chat/jinja_value.h"

namespace ms::jinja {

using FilterFn = Value (*)(const Value& input, Args& args);
using TestFn = bool (*)(const Value& input, Args& args);

// null when Jinja2 (as transformers configures it) has no filter or test of that name.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

// obj.name: a bound method (str.startswith, dict.items, ...) or else the item of that key.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: an element, key or character; undefined when missing, like Jinja2.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on a list or string.
Value get_slice(const Value& obj, std::optional<int64_t> start, std::optional<int64_t> stop,
                std::optional<int64_t> step);
// `needle in haystack`
bool contains(const Value& haystack, const Value& needle);
// The elements a for loop visits: list elements, dict keys, string characters.
Array iterate(const Value& v);

// Reads a builtin's arguments by position or keyword, rejecting ones it does not take.
class Params {
 public:
  Params(Args& args, std::string_view function, std::initializer_list<std::string_view> names);
  // Argument i (in the order of `names`), or null when not passed.
  const Value* get(size_t i) const { return bound_[i]; }
  Value get_or(size_t i, Value fallback) const { return bound_[i] ? *bound_[i] : std::move(fallback); }

 private:
  std::vector<const Value*> bound_;
};

}  // namespace ms::jinja
