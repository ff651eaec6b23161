#include "chat/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "util/error.h"

namespace ms::jinja {

uint32_t nesting_around(uint32_t inner, std::string_view what) {
  if (inner + 1 > kMaxNesting) fail("{} nest deeper than {} levels", what, kMaxNesting);
  return inner + 1;
}

Value::Value(Array a) {
  if (a.size() > kMaxItems) fail("a list of {} items is longer than the limit of {}", a.size(), kMaxItems);
  uint32_t deepest = 0;
  for (const Value& e : a) {
    deepest = std::max(deepest, e.nesting());
    array_untrusted = array_untrusted || has_untrusted(e);
  }
  array_nesting = nesting_around(deepest, "lists");
  v = std::make_shared<const Array>(std::move(a));
}

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(std::string key, Value value) {
  nesting = std::max(nesting, nesting_around(value.nesting(), is_namespace ? "namespaces" : "dicts"));
  holds_untrusted = holds_untrusted || has_untrusted(value);
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

Value make_object(std::vector<std::pair<std::string, Value>> items) {
  auto o = std::make_shared<Object>();
  for (const auto& item : items) {
    o->nesting = std::max(o->nesting, nesting_around(item.second.nesting(), "dicts"));
    o->holds_untrusted = o->holds_untrusted || has_untrusted(item.second);
  }
  o->items = std::move(items);
  return Value(std::move(o));
}

namespace {

Value from_json_at(const nlohmann::ordered_json& j, bool untrusted, uint32_t depth) {
  if (depth > kMaxNesting) fail("chat template input nests deeper than {} levels", kMaxNesting);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return nullptr;
    case nlohmann::ordered_json::value_t::boolean: return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned:
      if (j.get<uint64_t>() > uint64_t(INT64_MAX))  // Python's int would hold it; ours would wrap
        fail("chat template input: the integer {} is larger than {}", j.get<uint64_t>(), INT64_MAX);
      return int64_t(j.get<uint64_t>());
    case nlohmann::ordered_json::value_t::number_float: return j.get<double>();
    case nlohmann::ordered_json::value_t::string: return derived_string(j.get<std::string>(), untrusted);
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json_at(e, untrusted, depth + 1));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<std::string, Value>> items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json_at(e, untrusted, depth + 1));
      Value o = make_object(std::move(items));
      o.object().untrusted_keys = untrusted;
      return o;
    }
    default: fail("chat template input: unsupported JSON value of type {}", j.type_name());
  }
}

const std::vector<ByteRange> kNoMarks;

}  // namespace

Value from_json(const nlohmann::ordered_json& j, bool untrusted) { return from_json_at(j, untrusted, 0); }

const std::vector<ByteRange>& marks(const Value& v) {
  return v.is_string() && v.untrusted ? *v.untrusted : kNoMarks;
}

bool has_untrusted(const Value& v) {
  if (v.is_string()) return !marks(v).empty();
  if (v.is_array()) return v.array_untrusted;
  if (v.is_object()) {
    const Object& o = v.object();
    return o.holds_untrusted || (o.untrusted_keys && !o.items.empty());
  }
  return false;
}

void check_string_size(size_t n, std::string_view what) {
  if (n > kMaxStringBytes) fail("{} would make a string of {} bytes, more than the limit of {}", what, n, kMaxStringBytes);
}

Value string_value(MarkedText m) {
  Value s(std::move(m.text));
  if (!m.untrusted.empty()) s.untrusted = std::make_shared<const std::vector<ByteRange>>(std::move(m.untrusted));
  return s;
}

Value derived_string(std::string s, bool untrusted) {
  MarkedText m;
  m.append(s, untrusted);
  return string_value(std::move(m));
}

Value substring(const Value& s, size_t begin, size_t end) {
  MarkedText m;
  m.append(s.str(), marks(s), begin, end);
  return string_value(std::move(m));
}

void append_str(MarkedText& out, const Value& v) {
  if (v.is_string()) {
    out.append(v.str(), marks(v), 0, v.str().size());
    return;
  }
  out.append(to_str(v), has_untrusted(v));
}

Value key_value(const Object& o, const std::string& k) { return derived_string(k, o.untrusted_keys); }

std::string type_name(const Value& v) {
  if (v.is_undefined()) return "undefined";
  if (v.is_none()) return "NoneType";
  if (v.is_bool()) return "bool";
  if (v.is_int()) return "int";
  if (v.is_float()) return "float";
  if (v.is_string()) return "str";
  if (v.is_array()) return "list";
  if (v.is_object()) return v.object().is_namespace ? "Namespace" : "dict";
  return "function";
}

bool truthy(const Value& v) {
  if (v.is_undefined() || v.is_none()) return false;
  if (v.is_bool() || v.is_int()) return v.as_int() != 0;
  if (v.is_float()) return v.as_double() != 0.0;
  if (v.is_string()) return !v.str().empty();
  if (v.is_array()) return !v.array().empty();
  if (v.is_object()) return v.object().is_namespace || !v.object().items.empty();
  return true;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.str() == b.str();
  if (a.is_array()) {
    const Array &x = a.array(), &y = b.array();
    if (&x == &y) return true;
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i])) return false;
    return true;
  }
  if (a.is_object()) {
    const Object &x = a.object(), &y = b.object();
    if (&x == &y) return true;
    if (x.is_namespace || y.is_namespace) return false;  // Python compares them by identity
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, e] : x.items) {
      const Value* other = y.find(k);
      if (!other || !equals(e, *other)) return false;
    }
    return true;
  }
  return std::get<Value::FunctionPtr>(a.v) == std::get<Value::FunctionPtr>(b.v);
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) return a.str().compare(b.str()) < 0 ? -1 : (a.str() == b.str() ? 0 : 1);
  if (a.is_array() && b.is_array()) {
    const Array &x = a.array(), &y = b.array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i])) return compare(x[i], y[i]);
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail("cannot order {} and {}", type_name(a), type_name(b));
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: exponent form outside 1e-4 <= |d| < 1e16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exp10 = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = negative ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  } else if (exp10 < 0) {
    out += "0." + std::string(size_t(-exp10 - 1), '0') + digits;
  } else {
    size_t int_len = size_t(exp10) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return out;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  unsigned char c = s[i];
  int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  bool complete = extra >= 0 && i + extra < s.size();
  for (int k = 1; complete && k <= extra; ++k) complete = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
  if (!complete) {
    ++i;  // stray byte: treat as Latin-1 so nothing is lost
    return c;
  }
  char32_t cp = extra == 0 ? c : c & (0x3f >> extra);
  for (int k = 1; k <= extra; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += extra + 1;
  return cp;
}

namespace {

std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    char32_t c = next_code_point(s, i);
    if (c == char32_t(quote) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7f && c <= 0xa0)) {
      out += fmt::format("\\x{:02x}", uint32_t(c));
    } else {
      out.append(s, start, i - start);
    }
  }
  out += quote;
  return out;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char ch : s) {
    unsigned char c = ch;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", unsigned(c));
        else
          out += ch;
    }
  }
  out += '"';
}

struct JsonWriter {
  int indent;
  std::string_view item_sep, key_sep;
  bool sort_keys;
  std::string out;

  void newline(int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(level), ' ');
  }

  void write(const Value& v, int level) {
    check_string_size(out.size(), "tojson");
    if (v.is_none()) {
      out += "null";
    } else if (v.is_bool()) {
      out += v.as_int() ? "true" : "false";
    } else if (v.is_int()) {
      out += std::to_string(v.as_int());
    } else if (v.is_float()) {
      double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
    } else if (v.is_string()) {
      json_string(out, v.str());
    } else if (v.is_array()) {
      write_array(v.array(), level);
    } else if (v.is_object() && !v.object().is_namespace) {
      write_object(v.object(), level);
    } else {
      fail("Object of type {} is not JSON serializable", type_name(v));
    }
  }

  void write_array(const Array& a, int level) {
    if (a.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < a.size(); ++i) {
      if (i) out += item_sep;
      newline(level + 1);
      write(a[i], level + 1);
    }
    newline(level);
    out += ']';
  }

  void write_object(const Object& o, int level) {
    if (o.items.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& item : o.items) items.push_back(&item);
    if (sort_keys)
      std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      newline(level + 1);
      json_string(out, items[i]->first);
      out += key_sep;
      write(items[i]->second, level + 1);
    }
    newline(level);
    out += '}';
  }
};

}  // namespace

namespace {

// repr(v) appended to out, which may grow to kMaxStringBytes.
void repr_into(std::string& out, const Value& v) {
  check_string_size(out.size(), "printing a value");
  if (v.is_string()) {
    out += repr_string(v.str());
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.array().size(); ++i) {
      if (i) out += ", ";
      repr_into(out, v.array()[i]);
    }
    out += ']';
  } else if (v.is_object() && !v.object().is_namespace) {
    out += '{';
    bool first = true;
    for (const auto& [k, e] : v.object().items) {
      out += (first ? "" : ", ") + repr_string(k) + ": ";
      repr_into(out, e);
      first = false;
    }
    out += '}';
  } else {
    out += to_str(v);
  }
}

}  // namespace

std::string repr_for_error(const Value& v) {
  constexpr size_t kShown = 60;  // bytes of a string shown
  if (v.is_array()) return fmt::format("<list of {} items>", v.array().size());
  if (v.is_object() && !v.object().is_namespace) return fmt::format("<dict of {} items>", v.object().items.size());
  if (v.is_string() && v.str().size() > kShown) {
    size_t cut = kShown;
    while (cut > 0 && (static_cast<unsigned char>(v.str()[cut]) & 0xC0) == 0x80) --cut;  // a whole character
    return repr_string(v.str().substr(0, cut)) + "...";
  }
  return to_repr(v);
}

std::string to_repr(const Value& v) {
  std::string out;
  repr_into(out, v);
  check_string_size(out.size(), "printing a value");
  return out;
}

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return v.as_int() ? "True" : "False";
  if (v.is_int()) return std::to_string(v.as_int());
  if (v.is_float()) return float_repr(v.as_double());
  if (v.is_string()) return v.str();
  if (v.is_object() && v.object().is_namespace) return "<Namespace>";
  if (v.is_function()) return "<function " + v.function().name + ">";
  return to_repr(v);
}

std::string to_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep,
                    bool sort_keys) {
  JsonWriter w{indent, item_sep, key_sep, sort_keys, {}};
  w.write(v, 0);
  return std::move(w.out);
}

std::vector<std::string> code_points(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    next_code_point(s, i);
    out.emplace_back(s.substr(start, i - start));
  }
  return out;
}

bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

}  // namespace ms::jinja
