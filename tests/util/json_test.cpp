// The shared JSON parsing: nesting depth bounded with a clear error (never a stack overflow),
// duplicate keys refused where asked, and values in error messages summarized, never dumped.
#include "util/json.h"

#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace ms {
namespace {

using test::expect_error;
using json = nlohmann::json;

std::string nested(size_t depth, char open = '[', char close = ']') {
  return std::string(depth, open) + std::string(depth, close);
}

TEST(Json, NestingUpToTheBoundParses) {
  const json j = parse_json(nested(kMaxJsonDepth), "x.json");
  EXPECT_TRUE(j.is_array());
  EXPECT_TRUE(parse_json("{\"a\": [1, {\"b\": null}]}", "x.json").is_object());
}

TEST(Json, NestingPastTheBoundIsANamedError) {
  for (size_t depth : {size_t(kMaxJsonDepth) + 1, size_t(1000), size_t(300000)}) {
    SCOPED_TRACE(depth);
    expect_error([&] { parse_json(nested(depth), "deep.json"); }, {"deep.json", "deeper than 256"});
  }
  // Objects count as much as arrays, mixed too; unclosed nesting still stops at the bound.
  std::string objects;
  for (int i = 0; i < 300000; ++i) objects += "{\"k\":";
  expect_error([&] { parse_json(objects, "objects.json"); }, {"objects.json", "deeper than"});
  std::string mixed;
  for (int i = 0; i < 150000; ++i) mixed += "[{\"k\":";
  expect_error([&] { parse_json<nlohmann::ordered_json>(mixed, "mixed.json"); }, {"mixed.json", "deeper than"});
  expect_error([&] { parse_json(nested(20), "small.json", {.max_depth = 10}); }, {"small.json", "deeper than 10"});
}

TEST(Json, MalformedTextNamesWhere) {
  expect_error([&] { parse_json("{\"a\": ", "cut.json"); }, {"cut.json", "malformed JSON"});
  expect_error([&] { parse_json("[1e999]", "big.json"); }, {"big.json", "malformed JSON"});
  expect_error([&] { parse_json("", "empty.json"); }, {"empty.json", "malformed JSON"});
}

TEST(Json, DuplicateKeysAreRefusedOnlyWhenAsked) {
  const std::string twice = R"({"a": 1, "b": {"c": 2, "c": 3}})";
  EXPECT_EQ(parse_json(twice, "lax.json")["b"]["c"], 3);  // nlohmann keeps the last
  expect_error([&] { parse_json(twice, "strict.json", {.reject_duplicate_keys = true}); }, {"strict.json", "'c'", "twice"});
  expect_error([&] { parse_json(R"({"a": 1, "a": 1})", "top.json", {.reject_duplicate_keys = true}); }, {"top.json", "'a'"});
  // The same key in sibling objects is no duplicate.
  EXPECT_NO_THROW(parse_json(R"([{"a": 1}, {"a": 2}, {"a": {"a": 3}}])", "ok.json", {.reject_duplicate_keys = true}));
}

TEST(Json, SummaryIsShortAndShallow) {
  EXPECT_EQ(json_summary(json(3)), "3");
  EXPECT_EQ(json_summary(json("x")), "\"x\"");
  EXPECT_EQ(json_summary(json::parse("[1, 2]")), "[1, 2]");
  EXPECT_EQ(json_summary(json::parse(R"({"a": [1, {"b": [2]}]})")), "{\"a\": [1, {...}]}");
  // A long value is cut: the message stays short whatever the value.
  const std::string big(100000, 'x');
  EXPECT_LE(json_summary(json(big)).size(), 64u);
  json wide = json::array();
  for (int i = 0; i < 100000; ++i) wide.push_back(i);
  EXPECT_LE(json_summary(wide).size(), 64u);
  // The deepest value the parser lets through is summarized without recursing into it.
  const json deep = parse_json(nested(kMaxJsonDepth), "deep.json");
  EXPECT_EQ(json_summary(deep), "[[[...]]]");
}

}  // namespace
}  // namespace ms
