// The schema acceptor against the JSON Schema test suite (json-schema-org's cases, draft 4, as the
// npm package json-schema-test-suite ships them; scripts/setup.sh installs it with the node
// clients). Each case's schema either compiles or is refused naming a keyword outside the
// subset; over those that compile, a text the acceptor takes whole is never an instance the
// suite calls invalid (what constrained decoding promises). Valid instances it does not take
// (the acceptor writes members in their declared order, numbers as JSON writes them, bounded
// whitespace) are counted.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/json_schema.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const char* const kSuite = MOESTREAM_SOURCE_DIR "/tests/server/node/node_modules/json-schema-test-suite/tests/draft4";

// Whether the acceptor takes `text` whole.
bool takes(const std::shared_ptr<const JsonSchema>& schema, const std::string& text) {
  SchemaAcceptor a(schema);
  return a.feed(text) && a.complete();
}

// Every object's members in the order the schema's nearest "properties" declares them (the
// acceptor's order), the others after them as they came: a valid instance the acceptor should
// take where its members only come in another order.
ojson in_declared_order(const ojson& instance, const ojson& schema) {
  if (instance.is_array()) {
    ojson out = ojson::array();
    for (const ojson& e : instance) out.push_back(in_declared_order(e, schema.value("items", ojson::object())));
    return out;
  }
  if (!instance.is_object()) return instance;
  const ojson props = schema.value("properties", ojson::object());
  ojson out = ojson::object();
  for (const auto& [k, sub] : props.items())
    if (instance.contains(k)) out[k] = in_declared_order(instance[k], sub);
  for (const auto& [k, v] : instance.items())
    if (!out.contains(k)) out[k] = v;
  return out;
}

// The subset's root is an object (as OpenAI's strict mode has it): a case's schema S becomes the
// one member "v" of an object, its definitions at the root where "#/definitions/..." finds them,
// and each instance X the object {"v": X}.
ojson wrapped_schema(ojson schema) {
  ojson w = {{"type", "object"}, {"properties", ojson::object()}, {"required", {"v"}}, {"additionalProperties", false}};
  if (schema.is_object() && schema.contains("definitions")) {
    w["definitions"] = schema["definitions"];
    schema.erase("definitions");
  }
  w["properties"]["v"] = std::move(schema);
  return w;
}

struct Tally {
  int groups = 0, refused = 0;            // schemas, and of them refused by the compiler
  int valid = 0, valid_taken = 0;        // valid instances of compiled schemas, and taken
  int invalid = 0, invalid_refused = 0;  // invalid ones, and refused (all of them, or a failure)
};

void run_file(const fs::path& file, Tally& t) {
  std::ifstream in(file);
  const ojson groups = ojson::parse(in);
  for (const ojson& g : groups) {
    ++t.groups;
    const ojson root = wrapped_schema(g["schema"]);
    std::shared_ptr<const JsonSchema> schema;
    try {
      schema = JsonSchema::compile(root);
    } catch (const SchemaError& e) {
      ++t.refused;
      EXPECT_NE(std::string(e.what()), "") << file.filename() << ": " << g["description"];
      continue;
    }
    for (const ojson& c : g["tests"]) {
      const std::string what = file.filename().string() + ": " + g["description"].get<std::string>() + ": " +
                               c["description"].get<std::string>() + ": " + c["data"].dump();
      const ojson data = {{"v", c["data"]}};
      const bool taken = takes(schema, data.dump()) || takes(schema, in_declared_order(data, root).dump());
      if (c["valid"].get<bool>()) {
        ++t.valid;
        t.valid_taken += taken;
      } else {
        ++t.invalid;
        t.invalid_refused += !taken;
        EXPECT_FALSE(taken) << "takes an instance the suite calls invalid: " << what;
      }
    }
  }
}

TEST(JsonSchemaSuite, NeverTakesAnInvalidInstance) {
  if (!fs::is_directory(kSuite)) GTEST_SKIP() << kSuite << " is not installed (scripts/setup.sh installs it)";
  Tally t;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(kSuite)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    run_file(entry.path(), t);
  }
  std::printf("JSON Schema suite (draft 4): %d files, %d schemas, %d refused (keywords outside the subset); of the rest "
              "%d of %d valid instances taken, %d of %d invalid ones refused\n",
              files, t.groups, t.refused, t.valid_taken, t.valid, t.invalid_refused, t.invalid);
  EXPECT_GT(files, 20);
  // Most of draft 4's schemas test keywords outside the subset, or omit the type it requires: 11
  // of 73 compile (type, enum, required, properties with types, definitions and $ref).
  EXPECT_GE(t.groups - t.refused, 11) << "the subset's keywords should compile";
  EXPECT_GT(t.valid_taken, 0);
  EXPECT_EQ(t.invalid_refused, t.invalid);
}

}  // namespace
}  // namespace ms
