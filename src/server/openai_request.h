#pragma once
// Reading OpenAI chat and text completion requests into what the engine runs.
//
// Policy for request members (documented in docs/serve.md):
// - Members this server does not know are rejected (400, param names the member), as OpenAI
//   itself does: a typo such as "max_token" must not be silently ignored.
// - Known OpenAI members that change nothing here (user, metadata, store, parallel_tool_calls,
//   service_tier) are accepted and ignored; ones asking for what this server cannot do (n > 1,
//   logprobs, a JSON response_format, ...) are rejected naming the member.
// - null means "not given", as in OpenAI's API.
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/plan.h"
#include "runtime/sampler.h"

namespace ms {

class JsonSchema;

struct CompletionOptions {
  std::optional<int> max_tokens;  // max_tokens / max_completion_tokens; absent: up to the context
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension (vLLM's name): generate past end-of-sequence tokens
  bool json_object = false;    // response_format {"type": "json_object"}: constrained to one JSON object
  std::vector<std::string> forced_tools;  // tool_choice "required" or a function: one call to one of these
  std::vector<std::shared_ptr<const JsonSchema>> forced_tool_schemas;  // by forced_tools: strict tools' parameters
  // tool_choice "auto" where some tool is strict: every tool, and by tool a strict one's parameters.
  std::vector<std::string> auto_tools;
  std::vector<std::shared_ptr<const JsonSchema>> auto_tool_schemas;
  std::shared_ptr<const JsonSchema> json_schema;  // response_format json_schema: constrained to validate
  // Extension: MTP speculation for this request ("off", "mtp" or {"mode", "draft"}); unset: the server's.
  std::optional<SpeculativeOptions> speculative;
};

struct ChatRequest {
  CompletionOptions options;
  nlohmann::ordered_json messages;  // normalised for the chat template: content is a string
  nlohmann::ordered_json tools;     // null when none (or tool_choice "none")
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  // The Responses API: the response this one continues (its conversation goes first), and
  // whether this one is kept for later ones to continue (`store`, default true).
  std::string previous_response_id;
  bool store = true;
};

struct TextCompletionRequest {
  CompletionOptions options;
  std::string prompt;             // text, or ...
  std::vector<int> prompt_ids;    // ... token ids, when the prompt was given as ids
};

// Both throw ApiError (400) naming the member at fault. `vocab` bounds token ids in prompts.
ChatRequest parse_chat_request(const nlohmann::ordered_json& body);
// An Anthropic Messages API request (POST /v1/messages) as the chat request it asks for: the
// system prompt first, tool_result blocks as tool messages, tool_use blocks as tool calls, tools'
// input_schema as their parameters. Throws ApiError (400) naming the member at fault.
// count_only: the body of /v1/messages/count_tokens (max_tokens not required).
ChatRequest parse_messages_request(const nlohmann::ordered_json& body, bool count_only = false);
// An OpenAI Responses API request (POST /v1/responses) as the chat request it asks for:
// instructions as the system prompt, input items as messages (function_call items as the
// assistant's tool calls, function_call_output items as tool messages). previous_response_id is
// left for the server to resolve.
ChatRequest parse_responses_request(const nlohmann::ordered_json& body);
TextCompletionRequest parse_completion_request(const nlohmann::ordered_json& body, int vocab);

// Parses a request body: invalid UTF-8, malformed JSON, a non-object or nesting deeper than
// `max_depth` are 400s naming the problem.
nlohmann::ordered_json parse_body(const std::string& body, int max_depth = 64);

}  // namespace ms
