#include "util/json.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ms {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail("{}: read failed", path);
  return std::move(s).str();
}

nlohmann::json parse_json_file(const std::string& path, const JsonLimits& limits) {
  return parse_json(read_text_file(path), path, limits);
}

}  // namespace ms
