#include "chat/jinja_builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <charconv>
#include <map>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace ms::jinja {

Params::Params(Args& args, std::string_view function, std::initializer_list<std::string_view> names)
    : bound_(names.size(), nullptr) {
  if (args.positional.size() > names.size())
    fail("{} takes at most {} arguments, got {}", function, names.size(), args.positional.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = &args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    auto it = std::find(names.begin(), names.end(), key);
    if (it == names.end()) fail("{} got an unexpected argument '{}'", function, key);
    size_t i = size_t(it - names.begin());
    if (bound_[i]) fail("{} got argument '{}' twice", function, key);
    bound_[i] = &value;
  }
}

namespace {

// ---- strings ----

std::string encode(char32_t cp) {
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(utf8proc_int32_t(cp), buf);
  return std::string(reinterpret_cast<char*>(buf), size_t(n));
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) out += next_code_point(s, i);
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) out += encode(c);
  return out;
}

char32_t to_upper(char32_t c) { return char32_t(utf8proc_toupper(utf8proc_int32_t(c))); }
char32_t to_lower(char32_t c) { return char32_t(utf8proc_tolower(utf8proc_int32_t(c))); }
bool is_cased_letter(char32_t c) {
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::string lower(std::string_view s) {
  std::u32string u = decode(s);
  for (auto& c : u) c = to_lower(c);
  return encode(u);
}

std::string upper(std::string_view s) {
  std::u32string u = decode(s);
  for (auto& c : u) c = to_upper(c);
  return encode(u);
}

std::string capitalize(std::string_view s) {
  std::u32string u = decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_upper(u[i]) : to_lower(u[i]);
  return encode(u);
}

std::string title(std::string_view s) {
  std::u32string u = decode(s);
  bool previous_cased = false;
  for (auto& c : u) {
    bool cased = is_cased_letter(c);
    c = cased ? (previous_cased ? to_lower(c) : to_upper(c)) : c;
    previous_cased = cased;
  }
  return encode(u);
}

// Byte offsets of each code point of s, and s.size() last (4 bytes a character: strings
// over 4 GiB cannot come from a request or be computed).
std::vector<uint32_t> code_point_starts(std::string_view s) {
  if (s.size() > UINT32_MAX) fail("a string of {} bytes is too long to index", s.size());
  std::vector<uint32_t> starts;
  for (size_t i = 0; i < s.size();) {
    starts.push_back(i);
    next_code_point(s, i);
  }
  starts.push_back(s.size());
  return starts;
}

// Code-point operations keep a string's bytes as they are only when it is valid UTF-8 (a
// stray byte is re-encoded as Latin-1); otherwise their result is computed anew.
bool keeps_bytes(const std::string& s) { return utf8::first_invalid(s) == std::string::npos; }

// str.strip/lstrip/rstrip: whitespace, or any of `chars` when given.
std::string strip(std::string_view s, const Value* chars, bool left, bool right) {
  std::u32string u = decode(s);
  std::u32string set = chars && !chars->is_none() ? decode(chars->str()) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars && !chars->is_none() ? set.find(c) != set.npos : is_py_space(c); };
  size_t begin = 0, end = u.size();
  if (left)
    while (begin < end && strip_it(u[begin])) ++begin;
  if (right)
    while (end > begin && strip_it(u[end - 1])) --end;
  return encode(u.substr(begin, end - begin));
}

// strip() on a string value: what is left keeps its marks.
Value strip_value(const Value& sv, const Value* chars, bool left, bool right) {
  const std::string& s = sv.str();
  if (chars && !chars->is_none() && !chars->is_string()) fail("strip expects a string, got {}", type_name(*chars));
  if (!keeps_bytes(s)) return derived_string(strip(s, chars, left, right), has_untrusted(sv));
  std::u32string set = chars && !chars->is_none() ? decode(chars->str()) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars && !chars->is_none() ? set.find(c) != set.npos : is_py_space(c); };
  std::vector<uint32_t> starts = code_point_starts(s);
  size_t begin = 0, end = starts.size() - 1;  // code point indices
  auto at = [&](size_t i) {
    size_t pos = starts[i];
    return next_code_point(s, pos);
  };
  if (left)
    while (begin < end && strip_it(at(begin))) ++begin;
  if (right)
    while (end > begin && strip_it(at(end - 1))) --end;
  return substring(sv, starts[begin], starts[end]);
}

const std::string& string_arg(const Value* v, std::string_view what) {
  if (!v || !v->is_string()) fail("{} expects a string, got {}", what, v ? type_name(*v) : "nothing");
  return v->str();
}

// str.split: the parts keep their marks.
Value split(const Value& sv, const Value* sep, int64_t maxsplit) {
  const std::string& s = sv.str();
  Array parts;
  if (!sep || sep->is_none()) {
    if (!keeps_bytes(s)) {  // computed anew, as before marks existed
      std::u32string u = decode(s);
      size_t i = 0;
      while (i < u.size()) {
        while (i < u.size() && is_py_space(u[i])) ++i;
        if (i == u.size()) break;
        size_t start = i;
        if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
          size_t end = u.size();
          while (end > start && is_py_space(u[end - 1])) --end;
          parts.push_back(derived_string(encode(u.substr(start, end - start)), has_untrusted(sv)));
          break;
        }
        while (i < u.size() && !is_py_space(u[i])) ++i;
        parts.push_back(derived_string(encode(u.substr(start, i - start)), has_untrusted(sv)));
      }
      return Value(std::move(parts));
    }
    std::vector<uint32_t> starts = code_point_starts(s);
    const size_t n = starts.size() - 1;
    auto space = [&](size_t i) {
      size_t pos = starts[i];
      return is_py_space(next_code_point(s, pos));
    };
    size_t i = 0;
    while (i < n) {
      while (i < n && space(i)) ++i;
      if (i == n) break;
      size_t start = i;
      if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
        size_t end = n;
        while (end > start && space(end - 1)) --end;
        parts.push_back(substring(sv, starts[start], starts[end]));
        break;
      }
      while (i < n && !space(i)) ++i;
      parts.push_back(substring(sv, starts[start], starts[i]));
    }
    return Value(std::move(parts));
  }
  const std::string& delim = string_arg(sep, "split separator");
  if (delim.empty()) fail("split: empty separator");
  size_t start = 0;
  for (;;) {
    size_t hit = s.find(delim, start);
    if (hit == std::string::npos || (maxsplit >= 0 && int64_t(parts.size()) == maxsplit)) break;
    parts.push_back(substring(sv, start, hit));
    start = hit + delim.size();
  }
  parts.push_back(substring(sv, start, s.size()));
  return Value(std::move(parts));
}

// str.replace: the kept parts of s keep their marks, each inserted `with` has its own.
Value replace(const Value& sv, const Value& old_v, const Value& with_v, int64_t count) {
  const std::string &s = sv.str(), &old = old_v.str(), &with = with_v.str();
  MarkedText out;
  int64_t done = 0;
  auto insert = [&] {
    check_string_size(out.text.size() + with.size(), "replace");
    out.append(with, marks(with_v), 0, with.size());
    ++done;
  };
  if (old.empty()) {  // Python inserts `with` between every character and at both ends
    std::vector<uint32_t> starts = code_point_starts(s);
    for (size_t i = 0; i < starts.size(); ++i) {
      if (count < 0 || done < count) insert();
      if (i + 1 < starts.size()) out.append(s, marks(sv), starts[i], starts[i + 1]);
    }
    return string_value(std::move(out));
  }
  size_t start = 0;
  for (;;) {
    size_t hit = s.find(old, start);
    if (hit == std::string::npos || (count >= 0 && done == count)) break;
    out.append(s, marks(sv), start, hit);
    insert();
    start = hit + old.size();
  }
  out.append(s, marks(sv), start, s.size());
  return string_value(std::move(out));
}

// str.startswith/endswith accept a string or a tuple of strings.
bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  if (affix.is_array()) {
    for (const auto& a : affix.array())
      if (affix_matches(s, a, prefix)) return true;
    return false;
  }
  const std::string& a = string_arg(&affix, prefix ? "startswith" : "endswith");
  return prefix ? s.starts_with(a) : s.ends_with(a);
}

int64_t int_arg(const Value& v, std::string_view what) {
  if (!v.is_int() && !v.is_bool()) fail("{} expects an integer, got {}", what, type_name(v));
  return v.as_int();
}

Value bound(std::string name, std::function<Value(Args&)> fn) { return Value(Function{std::move(name), std::move(fn)}); }

// A new string computed from a whole string (a case change): untrusted if any of it was.
Value recased(const Value& sv, std::string out) { return derived_string(std::move(out), has_untrusted(sv)); }

Value string_method(const Value& sv, const std::string& name) {
  auto method = [&](auto fn) { return bound("str." + name, [sv, fn](Args& a) -> Value { return fn(sv, a); }); };
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return method([prefix](const Value& str, Args& a) -> Value {
      Params p(a, prefix ? "startswith" : "endswith", {"affix"});
      if (!p.get(0)) fail("{} needs an argument", prefix ? "startswith" : "endswith");
      return affix_matches(str.str(), *p.get(0), prefix);
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return method([left, right](const Value& str, Args& a) -> Value {
      Params p(a, "strip", {"chars"});
      return strip_value(str, p.get(0), left, right);
    });
  }
  if (name == "split")
    return method([](const Value& str, Args& a) -> Value {
      Params p(a, "split", {"sep", "maxsplit"});
      return split(str, p.get(0), p.get(1) ? int_arg(*p.get(1), "split maxsplit") : -1);
    });
  if (name == "replace")
    return method([](const Value& str, Args& a) -> Value {
      Params p(a, "replace", {"old", "new", "count"});
      string_arg(p.get(0), "replace");
      string_arg(p.get(1), "replace");
      return replace(str, *p.get(0), *p.get(1), p.get(2) ? int_arg(*p.get(2), "replace count") : -1);
    });
  if (name == "upper")
    return method([](const Value& str, Args& a) -> Value { Params(a, "upper", {}); return recased(str, upper(str.str())); });
  if (name == "lower")
    return method([](const Value& str, Args& a) -> Value { Params(a, "lower", {}); return recased(str, lower(str.str())); });
  if (name == "title")
    return method([](const Value& str, Args& a) -> Value { Params(a, "title", {}); return recased(str, title(str.str())); });
  if (name == "capitalize")
    return method([](const Value& str, Args& a) -> Value {
      Params(a, "capitalize", {});
      return recased(str, capitalize(str.str()));
    });
  if (name == "find")
    return method([](const Value& sv, Args& a) -> Value {
      Params p(a, "find", {"sub"});
      const std::string& str = sv.str();
      size_t hit = str.find(string_arg(p.get(0), "find"));
      return hit == std::string::npos ? int64_t{-1} : int64_t(decode(std::string_view(str).substr(0, hit)).size());
    });
  return Undefined{"'str object' has no attribute '" + name + "'"};
}

Value dict_method(const Value& dict, const std::string& name) {
  if (name == "get")
    return bound("dict.get", [dict](Args& a) -> Value {
      Params p(a, "get", {"key", "default"});
      if (!p.get(0)) fail("get needs a key");
      const Value* found = p.get(0)->is_string() ? dict.object().find(p.get(0)->str()) : nullptr;
      return found ? *found : p.get_or(1, nullptr);
    });
  if (name == "items" || name == "keys" || name == "values") {
    return bound("dict." + name, [dict, name](Args& a) -> Value {
      Params(a, name, {});
      Array out;
      const Object& o = dict.object();
      for (const auto& [k, v] : o.items) {
        if (name == "items") out.push_back(Array{key_value(o, k), v});
        else if (name == "keys") out.push_back(key_value(o, k));
        else out.push_back(v);
      }
      return Value(std::move(out));
    });
  }
  return Value();
}

// ---- sequences ----

size_t length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return code_points(v.str()).size();
  if (v.is_array()) return v.array().size();
  if (v.is_object()) return v.object().items.size();
  fail("object of type '{}' has no len()", type_name(v));
}

// `attribute` arguments of filters: "a.b" looks up a, then b; digits index lists.
Value lookup_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    int64_t index = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    bool numeric = !part.empty() && part[0] != '-' && ec == std::errc() && end == part.data() + part.size();
    cur = numeric ? get_item(cur, Value(index)) : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Args rest_args(Args& a, size_t from) {
  Args rest;
  rest.positional.assign(a.positional.begin() + std::min(from, a.positional.size()), a.positional.end());
  rest.keyword = a.keyword;
  return rest;
}

TestFn test_by_name(const Value& name) {
  TestFn t = name.is_string() ? find_test(name.str()) : nullptr;
  if (!t) fail("no test named {}", repr_for_error(name));
  return t;
}

// select/reject/selectattr/rejectattr share one shape: keep items where test(item) == keep.
Value select_items(const Value& input, Args& a, bool keep, bool by_attribute) {
  size_t first_test_arg = by_attribute ? 1 : 0;
  if (by_attribute && (a.positional.empty() || !a.positional[0].is_string()))
    fail("{} needs an attribute name", keep ? "selectattr" : "rejectattr");
  TestFn test = a.positional.size() > first_test_arg ? test_by_name(a.positional[first_test_arg]) : nullptr;
  Array out;
  for (const Value& item : iterate(input)) {
    Value subject = by_attribute ? lookup_path(item, a.positional[0].str()) : item;
    Args test_args = rest_args(a, first_test_arg + 1);
    bool passed = test ? test(subject, test_args) : truthy(subject);
    if (passed == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

// ---- filters ----

Value f_tojson(const Value& v, Args& a) {
  Params p(a, "tojson", {"indent", "separators", "sort_keys", "ensure_ascii"});
  int indent = -1;
  if (const Value* i = p.get(0); i && !i->is_none()) indent = int(int_arg(*i, "tojson indent"));
  std::string item_sep = indent < 0 ? ", " : ",", key_sep = ": ";
  if (const Value* s = p.get(1); s && !s->is_none()) {
    if (!s->is_array() || s->array().size() != 2 || !s->array()[0].is_string() || !s->array()[1].is_string())
      fail("tojson separators must be a pair of strings");
    item_sep = s->array()[0].str();
    key_sep = s->array()[1].str();
  }
  if (p.get(3) && truthy(*p.get(3))) fail("tojson(ensure_ascii=True) is not supported");
  return to_json(v, indent, item_sep, key_sep, truthy(p.get_or(2, false)));
}

// str(v) as a value: a string stays itself (marks included).
Value str_value(const Value& v) { return v.is_string() ? v : derived_string(to_str(v), has_untrusted(v)); }

Value f_string(const Value& v, Args& a) {
  Params(a, "string", {});
  return str_value(v);
}

Value f_trim(const Value& v, Args& a) {
  Params p(a, "trim", {"chars"});
  return strip_value(str_value(v), p.get(0), true, true);
}

Value f_lower(const Value& v, Args& a) {
  Params(a, "lower", {});
  return lower(to_str(v));
}

Value f_upper(const Value& v, Args& a) {
  Params(a, "upper", {});
  return upper(to_str(v));
}

Value f_capitalize(const Value& v, Args& a) {
  Params(a, "capitalize", {});
  return capitalize(to_str(v));
}

// Jinja2's title filter, unlike str.title, starts words only after whitespace and -({[<.
Value f_title(const Value& v, Args& a) {
  Params(a, "title", {});
  std::u32string u = decode(to_str(v));
  bool word_start = true;
  for (auto& c : u) {
    bool separator = is_py_space(c) || std::u32string_view(U"-({[<").find(c) != std::u32string_view::npos;
    c = separator ? c : word_start ? to_upper(c) : to_lower(c);
    word_start = separator;
  }
  return encode(u);
}

Value f_length(const Value& v, Args& a) {
  Params(a, "length", {});
  return int64_t(length(v));
}

Value f_items(const Value& v, Args& a) {
  Params(a, "items", {});
  if (v.is_undefined()) return Value(Array{});
  if (!v.is_object()) fail("filter 'items' expects a mapping, got {}", type_name(v));
  Array out;
  for (const auto& [k, e] : v.object().items) out.push_back(Array{key_value(v.object(), k), e});
  return Value(std::move(out));
}

Value f_default(const Value& v, Args& a) {
  Params p(a, "default", {"default_value", "boolean"});
  bool use_default = truthy(p.get_or(1, false)) ? !truthy(v) : v.is_undefined();
  return use_default ? p.get_or(0, "") : v;
}

Value f_join(const Value& v, Args& a) {
  Params p(a, "join", {"d", "attribute"});
  Value sep = p.get(0) ? str_value(*p.get(0)) : Value("");
  MarkedText out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) append_str(out, sep);
    append_str(out, p.get(1) ? lookup_path(item, to_str(*p.get(1))) : item);
    check_string_size(out.text.size(), "join");
    first = false;
  }
  return string_value(std::move(out));
}

Value f_first(const Value& v, Args& a) {
  Params(a, "first", {});
  Array items = iterate(v);
  return items.empty() ? Value(Undefined{"No first item, sequence was empty."}) : items.front();
}

Value f_last(const Value& v, Args& a) {
  Params(a, "last", {});
  Array items = iterate(v);
  return items.empty() ? Value(Undefined{"No last item, sequence was empty."}) : items.back();
}

Value f_replace(const Value& v, Args& a) {
  Params p(a, "replace", {"old", "new", "count"});
  string_arg(p.get(0), "replace");
  string_arg(p.get(1), "replace");
  return replace(str_value(v), *p.get(0), *p.get(1),
                 p.get(2) && !p.get(2)->is_none() ? int_arg(*p.get(2), "replace count") : -1);
}

Value f_safe(const Value& v, Args& a) {
  Params(a, "safe", {});
  return v;
}

Value f_list(const Value& v, Args& a) {
  Params(a, "list", {});
  return Value(iterate(v));
}

Value f_reverse(const Value& v, Args& a) {
  Params(a, "reverse", {});
  if (v.is_string()) {
    std::u32string u = decode(v.str());
    std::reverse(u.begin(), u.end());
    return encode(u);
  }
  Array items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value f_sort(const Value& v, Args& a) {
  Params p(a, "sort", {"reverse", "case_sensitive", "attribute"});
  bool reverse = truthy(p.get_or(0, false)), case_sensitive = truthy(p.get_or(1, false));
  auto key = [&](const Value& item) {
    Value k = p.get(2) ? lookup_path(item, to_str(*p.get(2))) : item;
    return !case_sensitive && k.is_string() ? Value(lower(k.str())) : k;
  };
  Array items = iterate(v);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? compare(key(y), key(x)) < 0 : compare(key(x), key(y)) < 0;
  });
  return Value(std::move(items));
}

Value f_map(const Value& v, Args& a) {
  Array out;
  if (a.positional.empty()) {
    Params p(a, "map", {"attribute", "default"});
    if (!p.get(0)) fail("filter 'map' needs a filter name or attribute=");
    for (const Value& item : iterate(v)) {
      Value x = lookup_path(item, to_str(*p.get(0)));
      out.push_back(x.is_undefined() && p.get(1) ? *p.get(1) : x);
    }
  } else {
    FilterFn f = a.positional[0].is_string() ? find_filter(a.positional[0].str()) : nullptr;
    if (!f) fail("map: no filter named {}", repr_for_error(a.positional[0]));
    for (const Value& item : iterate(v)) {
      Args rest = rest_args(a, 1);
      out.push_back(f(item, rest));
    }
  }
  return Value(std::move(out));
}

Value f_select(const Value& v, Args& a) { return select_items(v, a, true, false); }
Value f_reject(const Value& v, Args& a) { return select_items(v, a, false, false); }
Value f_selectattr(const Value& v, Args& a) { return select_items(v, a, true, true); }
Value f_rejectattr(const Value& v, Args& a) { return select_items(v, a, false, true); }

Value f_int(const Value& v, Args& a) {
  Params p(a, "int", {"default", "base"});
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_float()) {
    double t = std::trunc(v.as_double());
    if (!(t >= -9.2e18 && t <= 9.2e18)) fail("int: {} is out of the integer range", float_repr(v.as_double()));
    return int64_t(t);
  }
  if (v.is_string()) {
    std::string s = strip(v.str(), nullptr, true, true);
    try {
      size_t used = 0;
      int64_t i = std::stoll(s, &used, int(p.get(1) ? int_arg(*p.get(1), "int base") : 10));
      if (used == s.size()) return i;
    } catch (const std::exception&) {
    }
  }
  return p.get_or(0, int64_t{0});
}

Value f_float(const Value& v, Args& a) {
  Params p(a, "float", {"default"});
  if (v.is_number()) return v.as_double();
  if (v.is_string()) {
    std::string s = strip(v.str(), nullptr, true, true);
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (const std::exception&) {
    }
  }
  return p.get_or(0, 0.0);
}

Value f_abs(const Value& v, Args& a) {
  Params(a, "abs", {});
  if (v.is_float()) return std::fabs(v.as_double());
  if (v.is_number()) {
    if (v.as_int() == INT64_MIN) fail("abs: integer overflow");
    return int64_t(std::llabs(v.as_int()));
  }
  fail("bad operand type for abs(): '{}'", type_name(v));
}

Value f_indent(const Value& v, Args& a) {
  Params p(a, "indent", {"width", "first", "blank"});
  Value width = p.get_or(0, int64_t{4});
  Value pad = width;
  if (!width.is_string()) {
    int64_t n = std::max<int64_t>(int_arg(width, "indent width"), 0);  // Python: ' ' * -1 is ''
    if (uint64_t(n) > kMaxStringBytes) check_string_size(size_t(n), "indent");
    pad = std::string(size_t(n), ' ');
  }
  bool first = truthy(p.get_or(1, false)), blank = truthy(p.get_or(2, false));
  // Jinja2 appends a newline and splits into lines, so a trailing newline is not kept.
  Value text = str_value(v);
  const std::string& s = text.str();
  MarkedText out;
  for (size_t start = 0, i = 0; start <= s.size(); ++i) {
    size_t nl = std::min(s.find('\n', start), s.size());
    bool indent_it = (i > 0 || first) && (blank || nl > start);
    if (i) out.append("\n", false);
    if (indent_it) append_str(out, pad);
    out.append(s, marks(text), start, nl);
    check_string_size(out.text.size(), "indent");
    start = nl + 1;
  }
  return string_value(std::move(out));
}

// ---- tests ----

bool t_defined(const Value& v, Args& a) { Params(a, "defined", {}); return !v.is_undefined(); }
bool t_undefined(const Value& v, Args& a) { Params(a, "undefined", {}); return v.is_undefined(); }
bool t_none(const Value& v, Args& a) { Params(a, "none", {}); return v.is_none(); }
bool t_boolean(const Value& v, Args& a) { Params(a, "boolean", {}); return v.is_bool(); }
bool t_true(const Value& v, Args& a) { Params(a, "true", {}); return v.is_bool() && v.as_int(); }
bool t_false(const Value& v, Args& a) { Params(a, "false", {}); return v.is_bool() && !v.as_int(); }
bool t_integer(const Value& v, Args& a) { Params(a, "integer", {}); return v.is_int(); }
bool t_float(const Value& v, Args& a) { Params(a, "float", {}); return v.is_float(); }
bool t_number(const Value& v, Args& a) { Params(a, "number", {}); return v.is_number(); }
bool t_string(const Value& v, Args& a) { Params(a, "string", {}); return v.is_string(); }
bool t_mapping(const Value& v, Args& a) {
  Params(a, "mapping", {});
  return v.is_object() && !v.object().is_namespace;
}
bool t_iterable(const Value& v, Args& a) {
  Params(a, "iterable", {});
  return v.is_string() || v.is_array() || t_mapping(v, a);
}
bool t_sequence(const Value& v, Args& a) { return t_iterable(v, a); }
bool t_callable(const Value& v, Args& a) { Params(a, "callable", {}); return v.is_function(); }

int64_t number_input(const Value& v, std::string_view test) {
  if (!v.is_int() && !v.is_bool()) fail("test '{}' expects an integer, got {}", test, type_name(v));
  return v.as_int();
}
bool t_odd(const Value& v, Args& a) { Params(a, "odd", {}); return number_input(v, "odd") % 2 != 0; }
bool t_even(const Value& v, Args& a) { Params(a, "even", {}); return number_input(v, "even") % 2 == 0; }
bool t_divisibleby(const Value& v, Args& a) {
  Params p(a, "divisibleby", {"num"});
  int64_t d = p.get(0) ? int_arg(*p.get(0), "divisibleby") : 0;
  if (d == 0) fail("divisibleby: division by zero");
  return number_input(v, "divisibleby") % d == 0;
}

const Value& other(Args& a, std::string_view test) {
  Params p(a, test, {"other"});
  if (!p.get(0)) fail("test '{}' needs an argument", test);
  return *p.get(0);
}
bool t_eq(const Value& v, Args& a) { return equals(v, other(a, "eq")); }
bool t_ne(const Value& v, Args& a) { return !equals(v, other(a, "ne")); }
bool t_lt(const Value& v, Args& a) { return compare(v, other(a, "lt")) < 0; }
bool t_le(const Value& v, Args& a) { return compare(v, other(a, "le")) <= 0; }
bool t_gt(const Value& v, Args& a) { return compare(v, other(a, "gt")) > 0; }
bool t_ge(const Value& v, Args& a) { return compare(v, other(a, "ge")) >= 0; }
bool t_in(const Value& v, Args& a) { return contains(other(a, "in"), v); }
bool t_sameas(const Value& v, Args& a) {
  const Value& o = other(a, "sameas");
  // Python identity: the singletons None/True/False, or the same container.
  if (v.v.index() != o.v.index()) return false;
  if (v.is_array()) return &v.array() == &o.array();
  if (v.is_object()) return &v.object() == &o.object();
  return equals(v, o);
}
bool t_lower(const Value& v, Args& a) {
  Params(a, "lower", {});
  return v.is_string() && lower(v.str()) == v.str();
}
bool t_upper(const Value& v, Args& a) {
  Params(a, "upper", {});
  return v.is_string() && upper(v.str()) == v.str();
}

// A filter that computes a new string from its input (tojson, lower, ...) rather than
// keeping parts of it: a string it returns is untrusted when any of its input was.
template <FilterFn F>
Value computed(const Value& input, Args& args) {
  bool untrusted = has_untrusted(input);
  for (const Value& v : args.positional) untrusted = untrusted || has_untrusted(v);
  for (const auto& [k, v] : args.keyword) untrusted = untrusted || has_untrusted(v);
  Value out = F(input, args);
  if (out.is_string() && untrusted && marks(out).empty()) return derived_string(out.str(), true);
  return out;
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  // Filters that return parts of their input (string, trim, join, replace, indent, first, ...)
  // keep those parts' marks themselves; the others are wrapped in computed<>.
  static const std::map<std::string, FilterFn, std::less<>> filters = {
      {"tojson", computed<f_tojson>},
      {"string", f_string},
      {"trim", f_trim},
      {"lower", computed<f_lower>},
      {"upper", computed<f_upper>},
      {"capitalize", computed<f_capitalize>},
      {"title", computed<f_title>},
      {"length", f_length},
      {"count", f_length},
      {"items", f_items},
      {"default", f_default},
      {"d", f_default},
      {"join", f_join},
      {"first", f_first},
      {"last", f_last},
      {"replace", f_replace},
      {"safe", f_safe},
      {"list", f_list},
      {"reverse", computed<f_reverse>},
      {"sort", f_sort},
      {"map", f_map},
      {"select", f_select},
      {"reject", f_reject},
      {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr},
      {"int", f_int},
      {"float", f_float},
      {"abs", f_abs},
      {"indent", f_indent},
  };
  auto it = filters.find(name);
  return it == filters.end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  static const std::map<std::string, TestFn, std::less<>> tests = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none},       {"boolean", t_boolean},
      {"true", t_true},       {"false", t_false},         {"integer", t_integer}, {"float", t_float},
      {"number", t_number},   {"string", t_string},       {"mapping", t_mapping}, {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable}, {"odd", t_odd},         {"even", t_even},
      {"divisibleby", t_divisibleby}, {"eq", t_eq},       {"equalto", t_eq},      {"==", t_eq},
      {"ne", t_ne},           {"!=", t_ne},               {"lt", t_lt},           {"lessthan", t_lt},
      {"<", t_lt},            {"le", t_le},               {"<=", t_le},           {"gt", t_gt},
      {"greaterthan", t_gt},  {">", t_gt},                {"ge", t_ge},           {">=", t_ge},
      {"in", t_in},           {"sameas", t_sameas},       {"lower", t_lower},     {"upper", t_upper},
  };
  auto it = tests.find(name);
  return it == tests.end() ? nullptr : it->second;
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail("{}", std::get<Undefined>(obj.v).reason);
  if (obj.is_string()) return string_method(obj, name);
  if (obj.is_object()) {
    if (!obj.object().is_namespace)
      if (Value method = dict_method(obj, name); !method.is_undefined()) return method;
    if (const Value* v = obj.object().find(name)) return *v;
  }
  return Undefined{fmt::format("'{} object' has no attribute '{}'", type_name(obj), name)};
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail("{}", std::get<Undefined>(obj.v).reason);
  if (obj.is_object()) {
    if (key.is_string()) {
      if (const Value* v = obj.object().find(key.str())) return *v;
      return get_attr(obj, key.str());
    }
    return Undefined{fmt::format("'dict object' has no attribute {}", repr_for_error(key))};
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_array()) {
      int64_t n = int64_t(obj.array().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.array()[size_t(i)];
    } else {  // walks to the character rather than indexing them all
      const std::string& s = obj.str();
      if (i < 0) {
        int64_t n = 0;
        for (size_t pos = 0; pos < s.size(); ++n) next_code_point(s, pos);
        i += n;
      }
      size_t pos = 0;
      for (int64_t k = 0; k < i && pos < s.size(); ++k) next_code_point(s, pos);
      if (i >= 0 && pos < s.size()) {
        size_t end = pos;
        next_code_point(s, end);
        return substring(obj, pos, end);
      }
    }
    return Undefined{type_name(obj) + " index " + std::to_string(key.as_int()) + " out of range"};
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Undefined{fmt::format("'{} object' has no item {}", type_name(obj), repr_for_error(key))};
}

Value get_slice(const Value& obj, std::optional<int64_t> start, std::optional<int64_t> stop,
                std::optional<int64_t> step_opt) {
  int64_t step = step_opt.value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<uint32_t> starts;  // of each character, when slicing a string
  if (obj.is_string()) {
    starts = code_point_starts(obj.str());
  } else if (!obj.is_array()) {
    fail("'{}' object is not subscriptable with a slice", type_name(obj));
  }
  int64_t n = int64_t(obj.is_string() ? starts.size() - 1 : obj.array().size());
  // Python's slice index clamping.
  auto clamp = [&](std::optional<int64_t> i, int64_t fallback) {
    if (!i) return fallback;
    int64_t x = *i < 0 ? *i + n : *i;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  int64_t lo = clamp(start, step > 0 ? 0 : n - 1), hi = clamp(stop, step > 0 ? n : -1);
  step = std::clamp<int64_t>(step, -n - 1, n + 1);  // a longer step takes the first index only
  // The indices lo, lo + step, ... before hi; counted first so that no index overflows.
  const int64_t count = step > 0 ? (hi > lo ? (hi - lo - 1) / step + 1 : 0) : (lo > hi ? (lo - hi - 1) / -step + 1 : 0);
  if (obj.is_string()) {
    if (step == 1) return substring(obj, starts[size_t(lo)], starts[size_t(std::max(lo, hi))]);
    MarkedText out;
    for (int64_t k = 0; k < count; ++k) {
      size_t i = size_t(lo + k * step);
      out.append(obj.str(), marks(obj), starts[i], starts[i + 1]);
    }
    return string_value(std::move(out));
  }
  Array out;
  for (int64_t k = 0; k < count; ++k) out.push_back(obj.array()[size_t(lo + k * step)]);
  return Value(std::move(out));
}

bool contains(const Value& haystack, const Value& needle) {
  if (haystack.is_string()) {
    if (!needle.is_string()) fail("'in <string>' requires string as left operand, not {}", type_name(needle));
    return haystack.str().find(needle.str()) != std::string::npos;
  }
  if (haystack.is_object()) return needle.is_string() && haystack.object().find(needle.str());
  if (haystack.is_array()) {
    for (const auto& e : haystack.array())
      if (equals(e, needle)) return true;
    return false;
  }
  if (haystack.is_undefined()) return false;
  fail("argument of type '{}' is not iterable", type_name(haystack));
}

Array iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_array()) return v.array();
  if (v.is_string()) {
    std::vector<uint32_t> starts = code_point_starts(v.str());
    if (starts.size() - 1 > kMaxItems)
      fail("iterating a string of {} characters is longer than the limit of {}", starts.size() - 1, kMaxItems);
    Array out;
    for (size_t i = 0; i + 1 < starts.size(); ++i) out.push_back(substring(v, starts[i], starts[i + 1]));
    return out;
  }
  if (v.is_object() && !v.object().is_namespace) {
    Array out;
    for (const auto& [k, e] : v.object().items) out.push_back(key_value(v.object(), k));
    return out;
  }
  fail("'{}' object is not iterable", type_name(v));
}

}  // namespace ms::jinja
