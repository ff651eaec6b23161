// Reading OpenAI requests: every wrong input is a 400 naming the member at fault.
#include "server/openai_request.h"

#include <gtest/gtest.h>

#include "server/api_error.h"

namespace ms {
namespace {

using json = nlohmann::ordered_json;

// The ApiError a chat request body raises (status 0 when it is accepted).
ApiError chat_error(const std::string& body) {
  try {
    parse_chat_request(parse_body(body));
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "", "");
}

ApiError completion_error(const std::string& body) {
  try {
    parse_completion_request(parse_body(body), 100);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "", "");
}

const char* kHello = R"("messages": [{"role": "user", "content": "hi"}])";

TEST(OpenAIRequest, ReadsAChatRequest) {
  ChatRequest r = parse_chat_request(parse_body(
      R"({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
          {"role": "user", "content": "hi"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "42"}],
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
          "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": "x",
          "stream": true, "stream_options": {"include_usage": true}, "user": "u", "n": 1, "tool_choice": "auto"})"));
  EXPECT_EQ(r.messages[0], json({{"role", "system"}, {"content", "a\nb"}}));
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(*r.options.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.options.sampling.temperature, 0.5f);
  EXPECT_EQ(r.options.sampling.seed, 3u);
  EXPECT_EQ(r.options.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.options.stream && r.options.include_usage);
}

TEST(OpenAIRequest, NullMeansNotGiven) {
  ChatRequest r = parse_chat_request(parse_body(std::string("{") + kHello + R"(, "temperature": null, "max_tokens": null, "tools": null})"));
  EXPECT_FALSE(r.options.max_tokens);
  EXPECT_TRUE(r.tools.is_null());
}

TEST(OpenAIRequest, ToolChoiceNoneDropsTools) {
  ChatRequest r = parse_chat_request(parse_body(
      std::string("{") + kHello + R"(, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"})"));
  EXPECT_TRUE(r.tools.is_null());
}

struct Case {
  std::string body, param, code;
};

// Each case's body, read by `parse`, is a 400 naming its member and code.
template <class Parse>
void expect_errors(const std::vector<Case>& cases, Parse parse) {
  for (const Case& c : cases) {
    ApiError e(0, "", "");
    try {
      parse(parse_body(c.body));
    } catch (const ApiError& err) {
      e = err;
    }
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.what();
    EXPECT_EQ(e.code, c.code) << c.body << ": " << e.what();
  }
}

TEST(OpenAIRequest, ChatErrorsNameTheMember) {
  const std::string h = std::string("{") + kHello;
  const std::vector<Case> cases = {
      {R"({"model": "m"})", "messages", "missing_required_parameter"},
      {R"({"messages": []})", "messages", "invalid_value"},
      {R"({"messages": "hi"})", "messages", "invalid_type"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0].role", "missing_required_parameter"},
      {R"({"messages": [{"role": "wizard", "content": "hi"}]})", "messages[0].role", "invalid_value"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content", "missing_required_parameter"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "invalid_type"},
      {R"({"messages": [{"role": "user", "content": "x", "colour": 1}]})", "messages[0].colour", "unknown_parameter"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})", "messages[0].content[0].image_url",
       "unknown_parameter"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image"}]}]})", "messages[0].content[0].type", "unsupported_value"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}]})",
       "messages[0].tool_calls[0].function", "missing_required_parameter"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "messages[0].tool_calls", "invalid_value"},
      {h + R"(, "max_token": 5})", "max_token", "unknown_parameter"},
      {h + R"(, "max_tokens": "5"})", "max_tokens", "invalid_type"},
      {h + R"(, "max_tokens": 0})", "max_tokens", "invalid_value"},
      {h + R"(, "max_tokens": 1.5})", "max_tokens", "invalid_type"},
      {h + R"(, "max_tokens": 18446744073709551615})", "max_tokens", "invalid_value"},
      {h + R"(, "temperature": 3})", "temperature", "invalid_value"},
      {h + R"(, "temperature": "hot"})", "temperature", "invalid_type"},
      {h + R"(, "top_p": 0})", "top_p", "invalid_value"},
      {h + R"(, "presence_penalty": -5})", "presence_penalty", "invalid_value"},
      {h + R"(, "stop": [""]})", "stop", "invalid_value"},
      {h + R"(, "stop": [1]})", "stop[0]", "invalid_type"},
      {h + R"(, "stream": "yes"})", "stream", "invalid_type"},
      {h + R"(, "stream_options": {"include_usage": true}})", "stream_options", "invalid_value"},
      {h + R"(, "stream": true, "stream_options": {"usage": true}})", "stream_options.usage", "unknown_parameter"},
      {h + R"(, "n": 2})", "n", "unsupported_value"},
      {h + R"(, "logprobs": true})", "logprobs", "unsupported_value"},
      {h + R"(, "response_format": {"type": "json_schema", "json_schema": {}}})", "response_format.json_schema.schema",
       "missing_required_parameter"},
      {h + R"(, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}})",
       "response_format.json_schema.schema.properties.d.format", "unsupported_value"},
      {h + R"(, "response_format": {"type": "xml"}})", "response_format.type", "invalid_value"},
      {h + R"(, "tools": [{"type": "function"}]})", "tools[0].function", "missing_required_parameter"},
      {h + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]})", "tools[0].function.parameters",
       "invalid_type"},
      {h + R"(, "tool_choice": "required"})", "tool_choice", "invalid_value"},  // no tools to force
      {h + R"(, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       "tool_choice.function.name", "invalid_value"},
      {h + R"(, "model": 7})", "model", "invalid_type"},
  };
  for (const Case& c : cases) {
    ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.what();
    EXPECT_EQ(e.code, c.code) << c.body << ": " << e.what();
    EXPECT_EQ(e.to_json()["error"]["type"], "invalid_request_error");
  }
}

// The Messages API read as the chat it asks for: the system prompt first, a user turn's
// tool_result blocks as tool messages before its text, an assistant turn's tool_use blocks as
// tool calls, tools' input_schema as parameters.
TEST(MessagesRequest, ReadsAConversationWithTools) {
  const ChatRequest r = parse_messages_request(parse_body(R"({
    "model": "m", "max_tokens": 7, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "stop_sequences": ["END"], "temperature": 0.5,
    "tools": [{"name": "read", "description": "Read a file", "input_schema": {"type": "object"}}],
    "messages": [
      {"role": "user", "content": "What is in a.txt?"},
      {"role": "assistant", "content": [{"type": "text", "text": "Reading."},
                                        {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.txt"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                                   {"type": "text", "text": "And?"}]}]})"));
  EXPECT_EQ(r.options.max_tokens, 7);
  EXPECT_EQ(r.options.stop, std::vector<std::string>{"END"});
  EXPECT_FLOAT_EQ(r.options.sampling.temperature, 0.5f);
  const json want = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is in a.txt?"},
    {"role": "assistant", "content": "Reading.", "tool_calls": [{"id": "toolu_1", "type": "function",
      "function": {"name": "read", "arguments": {"path": "a.txt"}}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
    {"role": "user", "content": "And?"}])");
  EXPECT_EQ(r.messages, want);
  EXPECT_EQ(r.tools, json::parse(R"([{"type": "function", "function": {"name": "read", "parameters": {"type": "object"},
                                     "description": "Read a file"}}])"));
}

TEST(MessagesRequest, ErrorsNameTheMember) {
  const std::string m = R"("model": "m", "messages": [{"role": "user", "content": "hi"}])";
  const std::vector<Case> cases = {
      {"{" + m + "}", "max_tokens", "missing_required_parameter"},
      {R"({"max_tokens": 5, "messages": []})", "model", "missing_required_parameter"},
      {"{" + m + R"(, "max_tokens": 5, "temperature": 1.5})", "temperature", "invalid_value"},
      {R"({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "messages[0].role",
       "invalid_value"},
      {R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})",
       "messages[0].content[0].type", "unsupported_value"},
      {R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a",
          "name": "f", "input": {}}]}]})",
       "messages[0].content[0].type", "unsupported_value"},
      {"{" + m + R"(, "max_tokens": 5, "tool_choice": {"type": "tool", "name": "f"}})", "tool_choice.name",
       "invalid_value"},
      {"{" + m + R"(, "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 1024}})", "thinking",
       "unsupported_value"},
      {"{" + m + R"(, "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}]})", "tools[0].type",
       "unsupported_value"},
      {"{" + m + R"(, "max_tokens": 5, "tools": [{"name": "f"}]})", "tools[0].input_schema", "missing_required_parameter"},
      {"{" + m + R"(, "max_tokens": 5, "top_logprobs": 2})", "top_logprobs", "unknown_parameter"},
  };
  expect_errors(cases, [](const json& body) { return parse_messages_request(body); });
}

// The Responses API read as the chat it asks for: instructions first, function_call items joined
// to the assistant turn before them, function_call_output items as tool messages.
TEST(ResponsesRequest, ReadsInputItems) {
  const ChatRequest r = parse_responses_request(parse_body(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 9, "store": false,
    "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "a.txt?"}]},
              {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
              {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{\"path\": \"a.txt\"}"},
              {"type": "function_call_output", "call_id": "call_1", "output": "42"}]})"));
  EXPECT_EQ(r.options.max_tokens, 9);
  const json want = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "a.txt?"},
    {"role": "assistant", "content": "Reading.", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "read", "arguments": "{\"path\": \"a.txt\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "42"}])");
  EXPECT_EQ(r.messages, want);
  EXPECT_EQ(r.tools[0]["function"]["name"], "read");
}

TEST(ResponsesRequest, ErrorsNameTheMember) {
  const std::vector<Case> cases = {
      {R"({"model": "m"})", "input", "missing_required_parameter"},
      {R"({"input": []})", "input", "invalid_value"},
      {R"({"input": "x", "previous_response_id": ""})", "previous_response_id", "invalid_value"},
      {R"({"input": "x", "store": 1})", "store", "invalid_type"},
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type", "unsupported_value"},
      {R"({"input": "x", "tool_choice": "required"})", "tool_choice", "invalid_value"},
      {R"({"input": "x", "text": {"format": {"type": "json_schema"}}})", "text.format.schema", "missing_required_parameter"},
      {R"({"input": [{"type": "input_image"}]})", "input[0].type", "unsupported_value"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_file"}]}]})", "input[0].content[0].type",
       "unsupported_value"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens", "invalid_value"},
  };
  expect_errors(cases, parse_responses_request);
}

// chat_template_kwargs adds template variables; it may not replace one the server sets.
TEST(OpenAIRequest, TemplateKwargsCannotReplaceWhatTheServerSets) {
  const std::string h = std::string("{") + kHello;
  ChatRequest r = parse_chat_request(parse_body(h + R"(, "chat_template_kwargs": {"enable_thinking": false, "x": "y"}})"));
  EXPECT_EQ(r.template_kwargs, json({{"enable_thinking", false}, {"x", "y"}}));
  for (const char* name : {"messages", "tools", "add_generation_prompt", "documents", "bos_token", "eos_token", "unk_token",
                           "pad_token", "additional_special_tokens", "raise_exception", "strftime_now", "namespace",
                           "range", "dict"}) {
    ApiError e = chat_error(h + R"(, "chat_template_kwargs": {"enable_thinking": true, ")" + name + R"(": []}})");
    EXPECT_EQ(e.status, 400) << name;
    EXPECT_EQ(e.param, std::string("chat_template_kwargs.") + name);
    EXPECT_EQ(e.code, "reserved_parameter") << name;
    EXPECT_EQ(std::string(e.what()), std::string("chat_template_kwargs.") + name + " is set by the server and cannot be replaced");
  }
  EXPECT_EQ(chat_error(h + R"(, "chat_template_kwargs": ["messages"]})").param, "chat_template_kwargs");
}

TEST(OpenAIRequest, CompletionPrompts) {
  TextCompletionRequest r = parse_completion_request(parse_body(R"({"prompt": ["def f():"]})"), 100);
  EXPECT_EQ(r.prompt, "def f():");
  EXPECT_EQ(*r.options.max_tokens, 16);  // OpenAI's default for completions
  r = parse_completion_request(parse_body(R"({"prompt": [[1, 2, 3]], "max_tokens": 2})"), 100);
  EXPECT_EQ(r.prompt_ids, (std::vector<int>{1, 2, 3}));
  const std::vector<Case> cases = {
      {R"({"max_tokens": 2})", "prompt", "missing_required_parameter"},
      {R"({"prompt": ""})", "prompt", "invalid_value"},
      {R"({"prompt": 5})", "prompt", "invalid_type"},
      {R"({"prompt": [1, 200]})", "prompt[1]", "invalid_value"},
      {R"({"prompt": [1, -1]})", "prompt[1]", "invalid_value"},
      {R"({"prompt": ["a", "b"]})", "prompt", "unsupported_value"},
      {R"({"prompt": "a", "echo": true})", "echo", "unsupported_value"},
      {R"({"prompt": "a", "messages": []})", "messages", "unknown_parameter"},
  };
  for (const Case& c : cases) {
    ApiError e = completion_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.what();
    EXPECT_EQ(e.code, c.code) << c.body << ": " << e.what();
  }
}

TEST(OpenAIRequest, BodyProblems) {
  EXPECT_EQ(chat_error("").status, 400);
  EXPECT_EQ(chat_error("{\"messages\": [").code, "invalid_json");
  EXPECT_EQ(chat_error("[1, 2]").status, 400);
  EXPECT_EQ(chat_error("{\"messages\": \"\xc3\x28\"}").code, "invalid_utf8");
  EXPECT_EQ(chat_error(R"({"messages": "\ud800"})").code, "invalid_json");  // lone surrogate
  EXPECT_EQ(chat_error(R"({"messages": [], "temperature": 1e999})").code, "invalid_json");
  EXPECT_NE(std::string(chat_error(std::string(100000, '[')).what()).find("nests deeper"), std::string::npos);
  // Brackets inside strings are not nesting.
  EXPECT_EQ(chat_error(std::string("{") + kHello + R"(, "user": ")" + std::string(1000, '[') + "\"}").status, 0);
}

}  // namespace
}  // namespace ms
