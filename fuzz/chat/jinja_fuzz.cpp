// The chat template interpreter (chat/jinja*.cpp): the input is the template text, parsed
// and rendered with a fixed conversation, with tools and without, as the server renders it.
#include <string_view>

#include "fuzz_support.h"
#include "chat/chat_template.h"
#include "chat/conversation.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::ordered_json special = {{"bos_token", "<|endoftext|>"}, {"eos_token", "<|im_end|>"}};
  const nlohmann::ordered_json extra = {{"enable_thinking", false}};
  try {
    const ms::ChatTemplate tmpl(std::string_view(reinterpret_cast<const char*>(data), size), special);
    (void)tmpl.render(ms::fuzz::conversation(), ms::fuzz::tools(), true, extra);
    (void)tmpl.render(ms::fuzz::conversation(), nullptr, false);
  } catch (const ms::Error& e) {
    // A template that does not parse or raises while rendering: the expected outcomes.
    ms::fuzz::refused(e);
  }
  return 0;
}
