#pragma once
// An error answered to an HTTP client as OpenAI does:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace ms {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}

  nlohmann::ordered_json to_json() const {
    auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(s); };
    return {{"error", {{"message", what()}, {"type", type}, {"param", or_null(param)}, {"code", or_null(code)}}}};
  }

  int status;
  std::string type, param, code;
};

// 400 about one request member; `param` names it as a path, e.g. "messages[2].content".
[[noreturn]] inline void invalid_param(const std::string& param, const std::string& message,
                                       const std::string& code = "invalid_value") {
  throw ApiError(400, message, "invalid_request_error", param, code);
}

}  // namespace ms
