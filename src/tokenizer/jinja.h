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

 private:
  std::unique_ptr<std::vector<std::unique_ptr<Node>>> body_;
};

}  // namespace ms::jinja
