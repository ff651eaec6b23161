// The chat template's loader (ChatTemplate::from_tokenizer_config): tokenizer_config.json text
// (chat_template as a string or a named list, the special tokens), rendered with a fixed
// conversation when it loads.
#include <string>

#include "fuzz_support.h"
#include "chat/chat_template.h"
#include "chat/conversation.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ms::fuzz::write_scratch("tokenizer_config.json", data, size);
  try {
    const ms::ChatTemplate tmpl = ms::ChatTemplate::from_tokenizer_config(path);
    (void)tmpl.render(ms::fuzz::conversation(), ms::fuzz::tools(), true);
    (void)tmpl.render(ms::fuzz::conversation(), nullptr, false, {{"enable_thinking", false}});
  } catch (const ms::Error& e) {
    // A refused file, or a template that raises: the expected outcomes.
    ms::fuzz::refused(e);
  }
  return 0;
}
