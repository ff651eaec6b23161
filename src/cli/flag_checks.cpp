#include "cli/flag_checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "cli/model_options.h"
#include "util/error.h"

namespace ms::cli {

namespace {

// The whole of `text` as a number, or false.
bool read_real(const std::string& text, double& v) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && errno != ERANGE;
}

bool read_int(const std::string& text, long long& v) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtoll(text.c_str(), &end, 10);
  return end == text.c_str() + text.size() && errno != ERANGE;
}

bool is_layer_key(const std::string& k) {
  long long layer = 0;
  return k == "mtp" || (read_int(k, layer) && layer >= 0 && k[0] != '+');
}

// Why `item` (KEY<sep>BITS) is not one, or "".
std::string bits_item_error(const std::string& item, char sep, const std::vector<std::string>& keys) {
  const size_t at = item.find(sep);
  if (at == std::string::npos || at == 0) return fmt::format("'{}' is not KEY{}BITS", item, sep);
  const std::string key = item.substr(0, at);
  long long bits = 0;
  if (!read_int(item.substr(at + 1), bits)) return fmt::format("'{}' is not KEY{}BITS", item, sep);
  const bool key_ok = keys.empty() ? is_layer_key(key) : std::find(keys.begin(), keys.end(), key) != keys.end();
  if (!key_ok)
    return fmt::format("'{}' in '{}' is not {}", key, item,
                       keys.empty() ? std::string("a layer number or mtp") : fmt::format("one of {}", fmt::join(keys, ", ")));
  for (long long b : {2, 3, 4, 8, 16})
    if (bits == b) return "";
  return fmt::format("{} bits in '{}' is not an expert width (2, 3, 4, 8 or 16)", bits, item);
}

}  // namespace

CLI::Validator real_in(double lo, double hi, bool open_low) {
  const std::string range = fmt::format("{}{}, {}]", open_low ? "(" : "[", lo, hi);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!read_real(text, v) || !std::isfinite(v)) return fmt::format("'{}' is not a finite number", text);
        if (v < lo || v > hi || (open_low && v == lo)) return fmt::format("{} is outside {}", text, range);
        return "";
      },
      "NUMBER in " + range);
}

CLI::Validator int_in(long long lo, long long hi) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        long long v = 0;
        if (!read_int(text, v)) return fmt::format("'{}' is not a whole number", text);
        if (v < lo || v > hi) return fmt::format("{} is outside [{}, {}]", text, lo, hi);
        return "";
      },
      fmt::format("INT in [{}, {}]", lo, hi));
}

CLI::Validator parses_with(void (*parse)(const std::string&), const char* what) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        try {
          parse(text);
        } catch (const Error& e) {
          return e.what();
        }
        return "";
      },
      what);
}

CLI::Validator byte_size() {
  return parses_with([](const std::string& text) { parse_bytes(text); }, "SIZE");
}

CLI::Validator non_empty() {
  return CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; }, "");
}

CLI::Validator bits_list(char sep, const std::vector<std::string>& keys) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        if (text.empty()) return "must not be empty";
        std::set<std::string> seen;
        for (size_t pos = 0; pos <= text.size();) {
          const size_t comma = std::min(text.find(',', pos), text.size());
          const std::string item = text.substr(pos, comma - pos);
          if (std::string why = bits_item_error(item, sep, keys); !why.empty()) return why;
          if (const std::string key = item.substr(0, item.find(sep)); !seen.insert(key).second)
            return fmt::format("'{}' is given twice", key);
          pos = comma + 1;
        }
        return "";
      },
      fmt::format("KEY{}BITS,...", sep));
}

}  // namespace ms::cli
