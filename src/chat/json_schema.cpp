#include "chat/json_schema.h"

#include <algorithm>
#include <map>
#include <set>

namespace ms {

using ojson = nlohmann::ordered_json;

class SchemaCompiler {
 public:
  SchemaCompiler(JsonSchema& s, const ojson& root) : s_(s), root_(root) {}

  const SchemaNode* node(const ojson& v, const std::string& path) {
    if (!v.is_object()) throw SchemaError(path, where(path) + "a schema must be an object");
    static const std::set<std::string> known = {"type",  "properties", "required", "additionalProperties",
                                                "items", "enum",       "const",    "anyOf",
                                                "$defs", "definitions", "$ref",    "description",
                                                "title", "strict",     "$schema",  "$id",
                                                "default"};
    for (const auto& [k, _] : v.items())
      if (!known.count(k))
        throw SchemaError(join(path, k), where(join(path, k)) + "the keyword '" + k + "' is not supported");
    if (v.contains("$ref")) return ref(v["$ref"], join(path, "$ref"));
    SchemaNode n;
    if (v.contains("anyOf")) {
      const ojson& alts = v["anyOf"];
      if (!alts.is_array() || alts.empty()) throw SchemaError(join(path, "anyOf"), where(join(path, "anyOf")) + "anyOf must be a non-empty array");
      n.kind = SchemaNode::Kind::AnyOf;
      for (size_t i = 0; i < alts.size(); ++i) n.alternatives.push_back(node(alts[i], join(path, "anyOf") + "[" + std::to_string(i) + "]"));
      return add(std::move(n));
    }
    if (v.contains("const") || v.contains("enum")) {
      n.kind = SchemaNode::Kind::Literals;
      if (v.contains("const")) n.literals.push_back(v["const"].dump());
      if (v.contains("enum")) {
        const ojson& e = v["enum"];
        if (!e.is_array() || e.empty()) throw SchemaError(join(path, "enum"), where(join(path, "enum")) + "enum must be a non-empty array");
        for (const ojson& x : e) n.literals.push_back(x.dump());
      }
      return add(std::move(n));
    }
    if (!v.contains("type"))
      throw SchemaError(path, where(path) + "a schema needs a type, enum, const, anyOf or $ref");
    const ojson& type = v["type"];
    if (type.is_array()) {  // one of several types: anyOf over them
      n.kind = SchemaNode::Kind::AnyOf;
      for (const ojson& t : type) n.alternatives.push_back(typed(v, t, path));
      if (n.alternatives.empty()) throw SchemaError(join(path, "type"), where(join(path, "type")) + "type must not be empty");
      return add(std::move(n));
    }
    return typed(v, type, path);
  }

 private:
  static std::string join(const std::string& path, const std::string& k) { return path.empty() ? k : path + "." + k; }
  static std::string where(const std::string& path) { return path.empty() ? "" : path + ": "; }

  const SchemaNode* add(SchemaNode n) {
    s_.nodes_.push_back(std::move(n));
    return &s_.nodes_.back();
  }

  // A node of one type, with the keywords of `v` (at `base`) that type reads.
  const SchemaNode* typed(const ojson& v, const ojson& type, const std::string& base) {
    const std::string path = join(base, "type");
    if (!type.is_string()) throw SchemaError(path, where(path) + "type must be a string or an array of strings");
    const std::string t = type.get<std::string>();
    SchemaNode n;
    if (t == "object") {
      n.kind = SchemaNode::Kind::Object;
      std::vector<std::string> names;
      if (v.contains("properties")) {
        if (!v["properties"].is_object()) throw SchemaError(join(base, "properties"), where(join(base, "properties")) + "properties must be an object");
        for (const auto& [name, sub] : v["properties"].items()) {
          const std::string escaped = ojson(name).dump();
          n.properties.emplace_back(escaped.substr(1, escaped.size() - 2), node(sub, join(join(base, "properties"), name)));
          names.push_back(name);
        }
      }
      n.required.assign(n.properties.size(), false);
      if (v.contains("required")) {
        if (!v["required"].is_array()) throw SchemaError(join(base, "required"), where(join(base, "required")) + "required must be an array");
        for (const ojson& r : v["required"]) {
          const auto it = r.is_string() ? std::find(names.begin(), names.end(), r.get<std::string>()) : names.end();
          if (it == names.end())
            throw SchemaError(join(base, "required"), where(join(base, "required")) + "required names " + r.dump() + ", not a property");
          n.required[size_t(it - names.begin())] = true;
        }
      }
      if (v.contains("additionalProperties") && !v["additionalProperties"].is_boolean())
        throw SchemaError(join(base, "additionalProperties"),
                          where(join(base, "additionalProperties")) + "additionalProperties must be false (or true)");
    } else if (t == "array") {
      n.kind = SchemaNode::Kind::Array;
      if (!v.contains("items")) throw SchemaError(join(base, "items"), where(join(base, "items")) + "an array schema needs items");
      n.items = node(v["items"], join(base, "items"));
    } else if (t == "string") {
      n.kind = SchemaNode::Kind::String;
    } else if (t == "number") {
      n.kind = SchemaNode::Kind::Number;
    } else if (t == "integer") {
      n.kind = SchemaNode::Kind::Integer;
    } else if (t == "boolean") {
      n.kind = SchemaNode::Kind::Literals, n.literals = {"true", "false"};
    } else if (t == "null") {
      n.kind = SchemaNode::Kind::Literals, n.literals = {"null"};
    } else {
      throw SchemaError(path, where(path) + "type '" + t + "' is not a JSON schema type");
    }
    return add(std::move(n));
  }

  // "#/$defs/NAME" or "#/definitions/NAME": the definition's node, made once (a recursive
  // definition refers to itself through the node made first).
  const SchemaNode* ref(const ojson& r, const std::string& path) {
    if (!r.is_string()) throw SchemaError(path, where(path) + "$ref must be a string");
    const std::string target = r.get<std::string>();
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (target.rfind(p, 0) != 0) continue;
      const std::string name = target.substr(p.size()), group = p.substr(2, p.size() - 3);
      if (auto it = made_.find(target); it != made_.end()) return it->second;
      if (!root_.contains(group) || !root_[group].is_object() || !root_[group].contains(name))
        throw SchemaError(path, where(path) + "$ref " + target + " names no definition");
      SchemaNode* slot = const_cast<SchemaNode*>(add(SchemaNode{}));
      made_[target] = slot;
      *slot = *node(root_[group][name], group + "." + name);
      return slot;
    }
    throw SchemaError(path, where(path) + "$ref must be \"#/$defs/NAME\" or \"#/definitions/NAME\", is " + target);
  }

  JsonSchema& s_;
  const ojson& root_;
  std::map<std::string, const SchemaNode*> made_;
};

std::shared_ptr<const JsonSchema> JsonSchema::compile(const ojson& schema) {
  auto s = std::make_shared<JsonSchema>();
  SchemaCompiler c(*s, schema);
  s->root_ = c.node(schema, "");
  if (s->root_->kind != SchemaNode::Kind::Object) throw SchemaError("type", "the root of the schema must be an object");
  return s;
}

namespace {

using json_text::number_final;
using json_text::number_next;
using json_text::space;

// Whether some property at index >= from is required.
bool required_after(const SchemaNode* n, int from) {
  for (size_t j = size_t(from); j < n->required.size(); ++j)
    if (n->required[j]) return true;
  return false;
}

}  // namespace

SchemaAcceptor::SchemaAcceptor(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
  readings_.push_back({{Frame{schema_->root(), Phase::Value}}, 0, false});
}

void SchemaAcceptor::value_done(Reading r, std::vector<Reading>& out) const {
  r.stack.pop_back();
  if (r.stack.empty()) r.done = true;
  out.push_back(std::move(r));
}

// The top frame of r is a Value frame of `node` and c the value's first byte.
void SchemaAcceptor::start_value(Reading r, const SchemaNode* node, char c, std::vector<Reading>& out) const {
  Frame& f = r.stack.back();
  switch (node->kind) {
    case SchemaNode::Kind::AnyOf:
      for (const SchemaNode* alt : node->alternatives) start_value(r, alt, c, out);
      return;
    case SchemaNode::Kind::Literals: {
      const std::string first(1, c);
      bool prefix = false, whole = false;
      for (const std::string& l : node->literals)
        if (l[0] == c) prefix |= l.size() > 1, whole |= l.size() == 1;
      if (whole) value_done(r, out);
      if (prefix) {
        f = Frame{node, Phase::Literal, 0, first};
        out.push_back(std::move(r));
      }
      return;
    }
    case SchemaNode::Kind::Object:
    case SchemaNode::Kind::Array:
      if (c != (node->kind == SchemaNode::Kind::Object ? '{' : '[') || int(r.stack.size()) > kMaxDepth) return;
      f = Frame{node, node->kind == SchemaNode::Kind::Object ? Phase::ObjOpen : Phase::ArrOpen};
      out.push_back(std::move(r));
      return;
    case SchemaNode::Kind::String:
      if (c != '"') return;
      f = Frame{node, Phase::String};
      out.push_back(std::move(r));
      return;
    case SchemaNode::Kind::Number:
    case SchemaNode::Kind::Integer: {
      const int s = json_text::number_start(c);
      if (s < 0) return;
      f = Frame{node, Phase::Number, s};
      out.push_back(std::move(r));
      return;
    }
  }
}

void SchemaAcceptor::step(const Reading& in, char c, std::vector<Reading>& out) const {
  if (in.done) return;  // the root value is whole: nothing follows
  Reading r = in;
  Frame& f = r.stack.back();
  const SchemaNode* n = f.node;
  const bool structural = f.phase == Phase::Value || f.phase == Phase::ObjOpen || f.phase == Phase::ObjComma ||
                          f.phase == Phase::ObjColon || f.phase == Phase::ObjNext || f.phase == Phase::ArrOpen ||
                          f.phase == Phase::ArrNext;
  if (structural && space(c)) {
    // The root value starts at the first byte, as JsonAcceptor's; elsewhere gaps are bounded.
    if ((r.stack.size() == 1 && f.phase == Phase::Value) || !gap_space(r.space_run, c)) return;
    out.push_back(std::move(r));
    return;
  }
  r.space_run = 0;
  switch (f.phase) {
    case Phase::Value:
      return start_value(std::move(r), n, c, out);
    case Phase::ObjOpen:
    case Phase::ObjComma:
      if (c == '"') {
        f.phase = Phase::ObjKey, f.text.clear();
        out.push_back(std::move(r));
      } else if (c == '}' && f.phase == Phase::ObjOpen && !required_after(n, f.index)) {
        value_done(std::move(r), out);
      }
      return;
    case Phase::ObjKey: {
      // A property at or after index, with no required one skipped before it, whose name goes on so.
      const std::string next = f.text + c;
      for (size_t j = size_t(f.index); j < n->properties.size(); ++j) {
        const std::string& name = n->properties[j].first;
        if (c == '"' && name == f.text) {
          Reading k = r;
          k.stack.back().phase = Phase::ObjColon, k.stack.back().index = int(j);
          out.push_back(std::move(k));
        } else if (c != '"' && name.compare(0, next.size(), next) == 0) {
          f.text = next;
          out.push_back(std::move(r));
          return;  // one reading holds every candidate name: the candidates are recomputed each byte
        }
        if (n->required[j]) break;
      }
      return;
    }
    case Phase::ObjColon:
      if (c != ':') return;
      f.phase = Phase::ObjNext;
      {
        const SchemaNode* value = n->properties[size_t(f.index)].second;
        f.index += 1;
        r.stack.push_back(Frame{value, Phase::Value});
      }
      out.push_back(std::move(r));
      return;
    case Phase::ObjNext:
      if (c == ',' && size_t(f.index) < n->properties.size()) {
        f.phase = Phase::ObjComma;
        out.push_back(std::move(r));
      } else if (c == '}' && !required_after(n, f.index)) {
        value_done(std::move(r), out);
      }
      return;
    case Phase::ArrOpen:
    case Phase::ArrNext:
      if (c == ']') return value_done(std::move(r), out);
      if (f.phase == Phase::ArrNext) {
        if (c != ',') return;
        r.stack.push_back(Frame{n->items, Phase::Value});
        out.push_back(std::move(r));
        return;
      }
      f.phase = Phase::ArrNext;
      r.stack.push_back(Frame{n->items, Phase::Value});
      return start_value(std::move(r), n->items, c, out);
    case Phase::String:
      if (c == '"') return value_done(std::move(r), out);
      if (c == '\\') f.phase = Phase::Escape;
      else if (uint8_t(c) < 0x20) return;
      out.push_back(std::move(r));
      return;
    case Phase::Escape:
      if (c == 'u') f.phase = Phase::Unicode, f.index = 4;
      else if (json_text::escape(c)) f.phase = Phase::String;
      else return;
      out.push_back(std::move(r));
      return;
    case Phase::Unicode:
      if (!json_text::hex_digit(c)) return;
      if (--f.index == 0) f.phase = Phase::String;
      out.push_back(std::move(r));
      return;
    case Phase::Number: {
      const int s = number_next(f.index, c, n->kind == SchemaNode::Kind::Integer);
      if (s >= 0) {
        f.index = s;
        out.push_back(std::move(r));
      } else if (number_final(f.index)) {  // c ends the number and goes on after it
        std::vector<Reading> ended;
        value_done(std::move(r), ended);
        for (const Reading& e : ended) step(e, c, out);
      }
      return;
    }
    case Phase::Literal: {
      const std::string next = f.text + c;
      bool prefix = false, whole = false;
      for (const std::string& l : n->literals)
        if (l.compare(0, next.size(), next) == 0) prefix |= l.size() > next.size(), whole |= l.size() == next.size();
      if (whole) value_done(r, out);
      if (prefix) {
        f.text = next;
        out.push_back(std::move(r));
      }
      return;
    }
  }
}

bool SchemaAcceptor::feed(char c) {
  // A plain byte inside string values changes no reading: the common case, without copying them.
  if (in_string() && json_text::plain_string_byte(c)) return true;
  std::vector<Reading> out;
  for (const Reading& r : readings_) step(r, c, out);
  if (out.empty()) return false;
  if (out.size() == 1) {
    readings_ = std::move(out);
    return true;
  }
  // Readings that became the same are one.
  std::vector<Reading> unique;
  std::set<std::string> seen;
  for (Reading& r : out) {
    SchemaAcceptor one(*this);
    one.readings_ = {r};
    if (seen.insert(one.key()).second && unique.size() < kMaxReadings) unique.push_back(std::move(r));
  }
  readings_ = std::move(unique);
  return true;
}

bool SchemaAcceptor::feed(std::string_view s) {
  for (char c : s)
    if (!feed(c)) return false;
  return true;
}

bool SchemaAcceptor::in_string() const {
  return std::all_of(readings_.begin(), readings_.end(),
                     [](const Reading& r) { return !r.done && r.stack.back().phase == Phase::String; });
}

bool SchemaAcceptor::complete() const {
  return std::any_of(readings_.begin(), readings_.end(), [](const Reading& r) { return r.done; });
}

std::string SchemaAcceptor::key() const {
  std::string k;
  for (const Reading& r : readings_) {
    k += r.done ? 'D' : 'R';
    k += char(r.space_run);
    for (const Frame& f : r.stack) {
      k.append(reinterpret_cast<const char*>(&f.node), sizeof f.node);
      k += char(f.phase);
      k.append(reinterpret_cast<const char*>(&f.index), sizeof f.index);
      k += f.text;
      k += '\0';
    }
    k += '|';
  }
  return k;
}

}  // namespace ms
