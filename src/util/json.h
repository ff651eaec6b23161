#pragma once
// JSON parsing every loader and the server share: nesting depth is bounded (a 300k-deep input is
// an error, not a stack overflow), duplicate keys can be refused, and a value quoted in an error
// message is a short summary, never a recursive dump.
#include <fmt/format.h>

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace ms {

// Deeper than any model file or API request needs (tokenizer.json and tool schemas nest < 20).
inline constexpr int kMaxJsonDepth = 256;

struct JsonLimits {
  int max_depth = kMaxJsonDepth;
  bool reject_duplicate_keys = false;  // a key given twice in one object: nlohmann keeps the last
};

// Parses `text`; `where` names it in every error ("FILE: malformed JSON: ...", "FILE: JSON
// nests deeper than 256 levels", "FILE: key 'x' appears twice in one object").
template <class J = nlohmann::json>
J parse_json(std::string_view text, const std::string& where, const JsonLimits& limits = {}) {
  std::vector<std::set<std::string>> keys;  // per open object, with reject_duplicate_keys
  auto check = [&](int depth, nlohmann::detail::parse_event_t event, J& parsed) {
    using E = nlohmann::detail::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= limits.max_depth)
      fail("{}: JSON nests deeper than {} levels", where, limits.max_depth);
    if (!limits.reject_duplicate_keys) return true;
    if (event == E::object_start) keys.emplace_back();
    else if (event == E::object_end && !keys.empty()) keys.pop_back();
    else if (event == E::key && !keys.empty() && !keys.back().insert(parsed.template get<std::string>()).second)
      fail("{}: key '{}' appears twice in one object", where, parsed.template get<std::string>().substr(0, 80));
    return true;
  };
  try {
    return J::parse(text, check);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    fail("{}: malformed JSON: {}", where, e.what());
  }
}

// Reads a whole file and parses it (errors name the file).
nlohmann::json parse_json_file(const std::string& path, const JsonLimits& limits = {});
std::string read_text_file(const std::string& path);

namespace detail {
template <class J>
void summarize(const J& v, int depth, size_t budget, std::string& out) {
  if (out.size() >= budget) return;
  if (v.is_object() || v.is_array()) {
    const bool obj = v.is_object();
    out += obj ? '{' : '[';
    if (depth >= 2 && !v.empty()) out += "...";
    else {
      size_t i = 0;
      for (auto it = v.begin(); it != v.end() && out.size() < budget; ++it, ++i) {
        if (i) out += ", ";
        if (obj) out += fmt::format("\"{}\": ", it.key().substr(0, budget));
        summarize(*it, depth + 1, budget, out);
      }
    }
    out += obj ? '}' : ']';
    return;
  }
  out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
}  // namespace detail

// A value as an error message quotes it: at most about max_chars characters and two levels
// deep, the rest elided as "...".
template <class J>
std::string json_summary(const J& v, size_t max_chars = 60) {
  std::string out;
  detail::summarize(v, 0, max_chars, out);
  if (out.size() > max_chars) out = out.substr(0, max_chars) + "...";
  return out;
}

}  // namespace ms
