// The JSON-object acceptor against JSON text, valid and broken byte by byte, and the token mask
// it makes over a real tokenizer (pycoder-moe's).
#include "chat/json_constraint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace ms {
namespace {

// The length of the longest prefix of `text` the acceptor takes (text.size() when all of it).
size_t taken(const std::string& text) {
  JsonAcceptor a;
  for (size_t i = 0; i < text.size(); ++i)
    if (!a.feed(text[i])) return i;
  return text.size();
}

bool complete(const std::string& text) {
  JsonAcceptor a;
  return a.feed(text) && a.complete();
}

TEST(JsonAcceptor, TakesJsonObjects) {
  for (const char* text : {"{}", "{\"a\": 1}", "{\"a\":[1,-2.5e+3,0,0.1E-2,true,false,null,\"x\\u00e9\\n\"],\"b\":{}}",
                           "{\"\":[[],{}, [ {\"k\" : \"v\"} ] ]}", "{\"naïve\": \"κόσμε\"}\n"}) {
    EXPECT_TRUE(complete(text)) << text;
    EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;  // the reference agrees
  }
}

TEST(JsonAcceptor, StopsAtTheFirstByteNoJsonObjectHas) {
  struct Case {
    std::string text;
    size_t at;  // the byte refused
  };
  const Case cases[] = {
      {"[1]", 0},             // the top level is an object
      {" {}", 0},             // and starts the answer
      {"{'a': 1}", 1},        // keys are double-quoted
      {"{\"a\" 1}", 5},       // a colon after a key
      {"{\"a\": 01}", 7},     // no leading zeros
      {"{\"a\": 1.}", 8},     // a digit after the dot
      {"{\"a\": -}", 7},      // a digit after the minus
      {"{\"a\": tru}", 9},    // literals are whole
      {"{\"a\": 1,}", 8},     // no trailing comma
      {"{\"a\": [1 2]}", 9},  // commas between values
      {"{\"a\": \"\\x\"}", 8},  // known escapes only
      {"{\"a\": \"\n\"}", 7},   // control characters escaped
      {"{} {}", 3},           // one object
      {"{\"a\": 1]", 7},      // brackets match
  };
  for (const Case& c : cases) EXPECT_EQ(taken(c.text), c.at) << c.text;
  EXPECT_FALSE(complete("{\"a\": [1, 2]"));
}

TEST(JsonAcceptor, BoundsNestingAndWhitespace) {
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonAcceptor::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(taken(deep + "["), deep.size());
  // Between tokens one space, or a newline and up to kMaxIndent spaces or tabs.
  const std::string indent(kMaxIndent, ' ');
  EXPECT_TRUE(complete("{\n" + indent + "\"a\": 1, \"b\":\n\t2\n}"));
  EXPECT_EQ(taken("{  }"), 2u);
  EXPECT_EQ(taken("{\n" + indent + " }"), 2 + indent.size());
  EXPECT_EQ(taken("{\t}"), 1u);
  EXPECT_TRUE(complete("{\"" + indent + indent + indent + "\": 1}"));  // inside a string it is text
}

TEST(ToolCallAcceptor, TakesOneCallToANamedTool) {
  const std::string call = "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>";
  ToolCallAcceptor a({"list", "read"});
  EXPECT_TRUE(a.feed(call));
  EXPECT_TRUE(a.complete());
  EXPECT_FALSE(a.feed('\n'));  // one call, then end-of-sequence
  auto taken = [](std::vector<std::string> names, const std::string& text) {
    ToolCallAcceptor t(std::move(names));
    for (size_t i = 0; i < text.size(); ++i)
      if (!t.feed(text[i])) return i;
    return text.size();
  };
  EXPECT_EQ(taken({"list"}, call), std::string("<tool_call>\n{\"name\": \"").size());  // another tool
  EXPECT_EQ(taken({"read"}, "Sure. " + call), 0u);                                     // nothing before the call
  EXPECT_EQ(taken({"read"}, "<tool_call>\n{\"name\": \"read\", \"arguments\": [1]}"),
            std::string("<tool_call>\n{\"name\": \"read\", \"arguments\": ").size());  // arguments are an object
}

// Equal keys take the same bytes: states that differ only in what a literal still needs do not
// share a key (after "t" and after "n" three letters are left of each).
TEST(JsonAcceptor, KeysTellStatesApart) {
  JsonAcceptor t, n;
  ASSERT_TRUE(t.feed("{\"a\": t") && n.feed("{\"a\": n"));
  EXPECT_NE(t.key(), n.key());
  JsonAcceptor a, b;
  ASSERT_TRUE(a.feed("{\"a\": \"xy") && b.feed("{\"bcd\": \"z"));
  EXPECT_EQ(a.key(), b.key());  // inside a value string of the top-level object, alike
}

// A strict tool's arguments validate against its parameters; another tool's are any object.
TEST(ToolCallAcceptor, HoldsAStrictToolsArgumentsToItsSchema) {
  const auto path = JsonSchema::compile(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false})"));
  const std::vector<std::string> names = {"read", "list"};
  auto takes = [&](const std::string& name, const std::string& args) {
    ToolCallAcceptor a(names, {path, nullptr});
    return a.feed("<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>") && a.complete();
  };
  EXPECT_TRUE(takes("read", R"({"path": "a.txt"})"));
  EXPECT_FALSE(takes("read", R"({"path": 1})"));
  EXPECT_FALSE(takes("read", R"({"file": "a.txt"})"));
  EXPECT_TRUE(takes("list", R"({"file": "a.txt", "n": 1})"));
}

// tool_choice "auto" with a strict tool: free text, and each call held to its form and schema.
TEST(AutoToolAcceptor, HoldsTheCallsInFreeText) {
  const auto path = JsonSchema::compile(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false})"));
  auto call = [](const std::string& name, const std::string& args) {
    return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
  };
  auto takes = [&](const std::string& text, bool* complete = nullptr) {
    AutoToolAcceptor a({"read", "list"}, {path, nullptr});
    const bool fed = a.feed(text);
    if (complete) *complete = a.complete();
    return fed;
  };
  bool done = false;
  EXPECT_TRUE(takes("Any text, <tool or < tool_call> even {\"json\"", &done));
  EXPECT_TRUE(done);
  EXPECT_TRUE(takes("Reading it.\n" + call("read", R"({"path": "a.txt"})") + "\n" + call("list", R"({"n": 1})") + " done",
                    &done));
  EXPECT_TRUE(done);
  EXPECT_FALSE(takes(call("read", R"({"path": 1})")));
  EXPECT_FALSE(takes(call("read", R"({"file": "a.txt"})")));
  EXPECT_FALSE(takes(call("write", R"({"path": "a.txt"})")));
  EXPECT_FALSE(takes("x <<tool_call>{"));  // a call's opening, then not its form
  EXPECT_TRUE(takes("x <<tool_call>\n{\"name\": \"re", &done));
  EXPECT_FALSE(done) << "the answer may not end inside a call";
}

TEST(AutoToolConstraint, MasksOnlyWhatBreaksACall) {
  MS_REQUIRE_SHARED("models/pycoder-moe", dir);
  const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  const int eos = 0;  // <|endoftext|>
  const auto path = JsonSchema::compile(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false})"));
  const AutoToolAcceptor fresh({"read"}, {path});
  AutoToolConstraint c(tok, {eos}, fresh);
  std::string text;
  auto check = [&] {
    const std::vector<uint8_t>& allowed = c.allowed();
    AutoToolAcceptor now = fresh;
    ASSERT_TRUE(now.feed(text));
    EXPECT_EQ(allowed[eos], now.complete() ? 1 : 0) << text;
    for (int id = 1; id < tok.vocab_size(); ++id) {
      AutoToolAcceptor a = now;
      const bool want = !tok.is_special(id) && !tok.token_text(id).empty() && a.feed(tok.token_text(id));
      EXPECT_EQ(allowed[size_t(id)], want ? 1 : 0) << text << " + '" << tok.token_text(id) << "'";
    }
  };
  for (const std::string piece : {"Let me look.", " <tool_", "call>\n{\"name\": \"read\", \"arguments\": {\"pa",
                                  "th\": \"a\"}}\n</tool_call>"}) {
    for (int id : tok.encode(piece)) c.accept(id);
    text += piece;
    check();
  }
  EXPECT_TRUE(c.complete());
}

TEST(JsonConstraint, MasksTheTokensThatBreakTheObject) {
  MS_REQUIRE_SHARED("models/pycoder-moe", dir);
  const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  const int eos = 0;  // <|endoftext|>
  JsonConstraint c(tok, {eos}, JsonAcceptor());
  auto check = [&](const std::string& context) {
    const std::vector<uint8_t>& allowed = c.allowed();
    int n = 0;
    for (int id = 0; id < tok.vocab_size(); ++id) {
      JsonAcceptor a;
      const bool want = !tok.is_special(id) && !tok.token_text(id).empty() && a.feed(context) && a.feed(tok.token_text(id));
      if (id != eos) {
        EXPECT_EQ(allowed[size_t(id)], want ? 1 : 0) << context << " + '" << tok.token_text(id) << "'";
      }
      n += allowed[size_t(id)];
    }
    return n;
  };
  EXPECT_GT(check(""), 0);
  EXPECT_EQ(c.allowed()[eos], 0) << "end of sequence before the object is complete";
  for (int id : tok.encode("{\"x\": [1, 2"))
    c.accept(id);
  EXPECT_GT(check("{\"x\": [1, 2"), 0);
  for (int id : tok.encode("]}")) c.accept(id);
  ASSERT_TRUE(c.complete());
  const std::vector<uint8_t>& done = c.allowed();
  for (int id = 0; id < tok.vocab_size(); ++id) EXPECT_EQ(done[size_t(id)], id == eos ? 1 : 0) << id;
}

}  // namespace
}  // namespace ms
