// JSON schemas for constrained decoding: texts that validate are taken byte by byte to the end,
// texts that do not are refused at the byte where they stop validating (checked against
// nlohmann's parse for the JSON itself), and what the acceptor cannot hold to is refused by name.
#include "chat/json_schema.h"

#include <gtest/gtest.h>

#include <string>

namespace ms {
namespace {

using ojson = nlohmann::ordered_json;

bool validates(const std::shared_ptr<const JsonSchema>& s, const std::string& text) {
  SchemaAcceptor a(s);
  return a.feed(text) && a.complete();
}

std::shared_ptr<const JsonSchema> schema(const char* text) { return JsonSchema::compile(ojson::parse(text)); }

TEST(JsonSchema, ObjectsTakeTheirPropertiesInOrder) {
  const auto s = schema(R"({"type": "object", "additionalProperties": false, "required": ["name", "age"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"},
                   "tags": {"type": "array", "items": {"type": "string"}}}})");
  for (const char* good : {R"({"name": "a", "age": 3})", R"({"name":"a\"b","age":-12,"ok":true})",
                           R"({ "name" : "", "age" : 0 , "tags": ["x", "y\u00e9"] })", R"({"name": "a", "age": 3, "tags": []})"}) {
    EXPECT_TRUE(validates(s, good)) << good;
    EXPECT_TRUE(ojson::parse(good).is_object()) << good;
  }
  for (const char* bad : {R"({"name": "a"})", R"({"name": 1, "age": 3})", R"({"name": "a", "age": 1.5})",
                          R"({"name": "a", "age": 3, "x": 1})", R"({"name": "a", "age": 3, "ok": "yes"})",
                          R"({"age": 3, "name": "a"})", R"({"name": "a", "age": 3, "tags": [1]})", R"([])", R"({"name": "a", "age": 3,})"})
    EXPECT_FALSE(validates(s, bad)) << bad;
}

TEST(JsonSchema, EnumsConstsAndAnyOf) {
  const auto s = schema(R"({"type": "object", "required": ["c", "k", "v"], "properties": {
    "c": {"enum": ["red", "green", 1, 12, null]}, "k": {"const": "fixed"},
    "v": {"anyOf": [{"type": "number"}, {"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"]}]}}})");
  for (const char* good : {R"({"c": "red", "k": "fixed", "v": 2.5e-3})", R"({"c": 12, "k": "fixed", "v": {"x": null}})",
                           R"({"c": 1, "k": "fixed", "v": -0})", R"({"c": null, "k": "fixed", "v": 7})"})
    EXPECT_TRUE(validates(s, good)) << good;
  for (const char* bad : {R"({"c": "blue", "k": "fixed", "v": 1})", R"({"c": 13, "k": "fixed", "v": 1})",
                          R"({"c": "red", "k": "other", "v": 1})", R"({"c": "red", "k": "fixed", "v": "1"})",
                          R"({"c": "red", "k": "fixed", "v": {}})"})
    EXPECT_FALSE(validates(s, bad)) << bad;
}

TEST(JsonSchema, RecursiveDefinitions) {
  const auto s = schema(R"({"type": "object", "properties": {"tree": {"$ref": "#/$defs/node"}}, "required": ["tree"],
    "$defs": {"node": {"type": "object", "required": ["v", "kids"], "properties": {
      "v": {"type": ["number", "null"]}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}})");
  EXPECT_TRUE(validates(s, R"({"tree": {"v": 1.5, "kids": [{"v": null, "kids": []}, {"v": 2, "kids": []}]}})"));
  EXPECT_FALSE(validates(s, R"({"tree": {"v": "x", "kids": []}})"));
  EXPECT_FALSE(validates(s, R"({"tree": {"v": 1, "kids": [{"v": 1}]}})"));
}

TEST(JsonSchema, RefusesWhatItCannotHoldToByName) {
  struct Case {
    const char* schema;
    const char* path;
  };
  const Case cases[] = {
      {R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "a+"}}})", "properties.s.pattern"},
      {R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})", "properties.n.minimum"},
      {R"({"type": "object", "properties": {"x": {}}})", "properties.x"},
      {R"({"type": "object", "properties": {"x": {"oneOf": []}}})", "properties.x.oneOf"},
      {R"({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}})", "properties.x.$ref"},
      {R"({"type": "object", "properties": {"a": {"type": "array"}}})", "properties.a.items"},
      {R"({"type": "object", "properties": {"a": {"type": "object", "additionalProperties": {"type": "string"}}}})",
       "properties.a.additionalProperties"},
      {R"({"type": "object", "required": ["z"], "properties": {}})", "required"},
      {R"({"type": "string"})", "type"},
  };
  for (const Case& c : cases) {
    try {
      JsonSchema::compile(ojson::parse(c.schema));
      ADD_FAILURE() << c.schema << " compiled";
    } catch (const SchemaError& e) {
      EXPECT_EQ(e.path, c.path) << c.schema << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace ms
