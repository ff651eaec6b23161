#pragma once
// The parsed form of a Jinja2 template: expression and statement trees, each node with the
// template line it came from so that render errors can name it.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja_builtins.h"
#include "chat/jinja_value.h"

namespace ms::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // literal
    Name,       // name
    List,       // operands: elements
    Dict,       // operands: key0, value0, key1, value1, ...
    Attr,       // operands[0].name
    Item,       // operands[0][operands[1]]
    Slice,      // operands[0][start:stop:step]; absent parts are null
    Call,       // operands[0](operands[1..], keywords)
    Filter,     // operands[0] | name(operands[1..], keywords); filter set
    Test,       // operands[0] is [not] name(operands[1..]); test set
    Unary,      // name in {"-", "+", "not"} applied to operands[0]
    Binary,     // operands[0] name operands[1]; name is an arithmetic op, "~", "and", "or"
    Compare,    // operands[0] ops[0] operands[1] ops[1] operands[2] ... (chained, like Python)
    Condition,  // operands[0] if operands[1] else operands[2] (null: undefined)
  };
  Kind kind;
  int line;
  std::string name;
  Value literal;
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
  FilterFn filter = nullptr;
  TestFn test = nullptr;
  bool negated = false;
  int depth = 1;  // of this tree: 1 + the deepest operand
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required (undefined when not passed, as in Jinja2)
};

struct Node {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // if conditions[i]: bodies[i] ... else: else_body
    For,       // for targets in expr [if condition]: bodies[0] else: else_body
    Set,       // set targets = expr, or set targets[0].attribute = expr (namespace)
    SetBlock,  // set targets[0] %} bodies[0] {% endset
    Macro,     // macro name(params): bodies[0]
    Break,
    Continue,
    Block,     // bodies[0] rendered in place (transformers' {% generation %})
  };
  Kind kind;
  int line;
  std::string text;
  std::string name;
  std::string attribute;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body else_body;
  std::vector<std::string> targets;
  std::vector<MacroParam> params;
  bool reads_loop = true;  // For: its body names `loop` (else the renderer skips building it)
};

// Parses template source with transformers' settings (trim_blocks, lstrip_blocks, no trailing
// newline); fails with "chat template line N: ..." on anything it cannot run.
Body parse_template(std::string_view source);

}  // namespace ms::jinja
