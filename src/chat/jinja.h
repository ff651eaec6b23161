#pragma once
// A Jinja2 interpreter for the subset Hugging Face chat templates use, configured as
// transformers configures Jinja2: trim_blocks and lstrip_blocks on, no autoescaping,
// loop controls, and the globals raise_exception, strftime_now, namespace, range and dict.
// Parse and render errors are ms::Error("chat template line N: ...").
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/marked_text.h"

namespace ms::jinja {

struct Node;

class Template {
 public:
  explicit Template(std::string_view source);
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  ~Template();

  // Renders with the members of `context` (a JSON object) as template variables.
  std::string render(const nlohmann::ordered_json& context) const;
  // Renders with the members of both objects as variables (a trusted one wins a clash); the
  // result marks every byte that came from an `untrusted` string, through whatever the
  // template did with it (concatenation and slicing keep the marks of each part; a string
  // computed from untrusted input, e.g. by tojson or lower, is untrusted whole).
  MarkedText render(const nlohmann::ordered_json& trusted, const nlohmann::ordered_json& untrusted) const;

 private:
  std::unique_ptr<std::vector<std::unique_ptr<Node>>> body_;
};

}  // namespace ms::jinja
