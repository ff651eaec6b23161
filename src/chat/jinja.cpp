#include "chat/jinja.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>

#include "chat/jinja_ast.h"
#include "util/error.h"

namespace ms::jinja {
namespace {

// An error that already names its template line; outer nodes let it through unchanged.
struct LocatedError : Error {
  using Error::Error;
};

// Runs f, giving any error from it the template line of the innermost node that failed.
template <class F>
auto at_line(int line, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& e) {
    throw LocatedError(fmt::format("chat template line {}: {}", line, e.what()));
  }
}

[[noreturn]] void fail_undefined(const Value& v) { fail("{}", std::get<Undefined>(v.v).reason); }

// What one render may do. A real template renders a conversation with a few hundred loop
// iterations and calls nested a few deep; these stop a runaway one (a self-recursive macro,
// a loop over range(10**9), doubling a string) with an error instead of exhausting the
// stack, memory or time. The loop bound is 2.5 times what the largest conversation a
// 262k-token context holds needs (~50k messages, looped over twice), quick to reach
// (docs/PERFORMANCE.md#chat-templates).
constexpr int kMaxCallDepth = 64;                         // macro calls inside macro calls
constexpr int kMaxRenderDepth = 400;                      // nested statements and expressions
constexpr int64_t kMaxLoopIterations = 250'000;           // all loop iterations of one render
constexpr size_t kMaxOutputBytes = kMaxStringBytes;       // the rendered text
constexpr size_t kMaxWorkBytes = size_t{256} << 20;       // all strings the render computes

// Variables visible at one point: a frame per for-loop iteration and per macro call, as in Jinja2.
struct Scope {
  const Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent)
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value value) {
    for (auto& [k, v] : vars)
      if (k == name) {
        v = std::move(value);
        return;
      }
    vars.emplace_back(name, std::move(value));
  }
};

enum class Flow { Normal, Break, Continue };

int64_t checked_int(const Value& v, std::string_view what) {
  if (!v.is_int() && !v.is_bool()) fail("{} must be an integer, got {}", what, type_name(v));
  return v.as_int();
}

// x ** y for y >= 0, by squaring; fails where Python would need a big integer.
int64_t int_power(int64_t x, int64_t y) {
  int64_t result = 1, base = x;
  for (int64_t e = y; e > 0; e >>= 1) {
    if ((e & 1) && __builtin_mul_overflow(result, base, &result)) fail("integer overflow in {} ** {}", x, y);
    if (e > 1 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow in {} ** {}", x, y);
  }
  return result;
}

Value concat(const Value& a, const Value& b) {
  check_string_size(a.str().size() + b.str().size(), "'+'");
  MarkedText out;
  append_str(out, a);
  append_str(out, b);
  return string_value(std::move(out));
}

// A string or list repeated n times (none when n <= 0), within the size limits.
Value repeat(const Value& a, int64_t n) {
  if (n <= 0) return a.is_string() ? Value("") : Value(Array{});
  const size_t unit = a.is_string() ? a.str().size() : a.array().size();
  const size_t limit = a.is_string() ? kMaxStringBytes : kMaxItems;
  if (unit > 0 && uint64_t(n) > limit / unit)
    fail("repeating {} {} times is larger than the limit of {} {}", a.is_string() ? "a string" : "a list", n, limit,
         a.is_string() ? "bytes" : "items");
  if (a.is_string() && marks(a).empty()) {
    std::string out;
    out.reserve(unit * size_t(n));
    for (int64_t i = 0; i < n; ++i) out += a.str();
    return out;
  }
  if (a.is_string()) {
    MarkedText out;
    for (int64_t i = 0; i < n; ++i) append_str(out, a);
    return string_value(std::move(out));
  }
  Array out;
  out.reserve(unit * size_t(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), a.array().begin(), a.array().end());
  return Value(std::move(out));
}

// Python's arithmetic on ints, floats, strings and lists.
Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
  };
  if (a.is_number() && b.is_number()) {
    bool ints = !a.is_float() && !b.is_float();
    int64_t x = ints ? a.as_int() : 0, y = ints ? b.as_int() : 0, r = 0;
    double dx = a.as_double(), dy = b.as_double();
    auto checked = [&](bool overflowed) -> Value {
      if (overflowed) fail("integer overflow in {} {} {}", x, op, y);
      return r;
    };
    if (op == "+") return ints ? checked(__builtin_add_overflow(x, y, &r)) : Value(dx + dy);
    if (op == "-") return ints ? checked(__builtin_sub_overflow(x, y, &r)) : Value(dx - dy);
    if (op == "*") return ints ? checked(__builtin_mul_overflow(x, y, &r)) : Value(dx * dy);
    if (op == "/") {
      if (dy == 0) fail("division by zero");
      return dx / dy;
    }
    if (op == "//" || op == "%") {
      if (dy == 0) fail("integer division or modulo by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) fail("integer overflow in {} {} {}", x, op, y);
        int64_t q = x / y;
        r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors toward negative infinity
          --q;
          r += y;
        }
        return op == "//" ? Value(q) : Value(r);
      }
      double q = std::floor(dx / dy);
      return op == "//" ? Value(q) : Value(dx - q * dy);
    }
    if (op == "**") {
      if (ints && y >= 0) return int_power(x, y);
      return std::pow(dx, dy);
    }
    return unsupported();
  }
  if (op == "+" && a.is_string() && b.is_string()) return concat(a, b);
  if (op == "+" && a.is_array() && b.is_array()) {
    if (a.array().size() + b.array().size() > kMaxItems)
      fail("a list of {} items is longer than the limit of {}", a.array().size() + b.array().size(), kMaxItems);
    Array out = a.array();
    out.insert(out.end(), b.array().begin(), b.array().end());
    return Value(std::move(out));
  }
  if (op == "*" && (a.is_string() || a.is_array()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
  if (op == "*" && (b.is_string() || b.is_array()) && (a.is_int() || a.is_bool())) return arithmetic(op, b, a);
  return unsupported();
}

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  int c = compare(a, b);
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

// ---- globals ----

Value g_range(Args& a) {
  Params p(a, "range", {"start", "stop", "step"});
  if (!p.get(0)) fail("range expected at least 1 argument");
  int64_t start = 0, stop, step = p.get(2) ? checked_int(*p.get(2), "range step") : 1;
  if (p.get(1)) {
    start = checked_int(*p.get(0), "range start");
    stop = checked_int(*p.get(1), "range stop");
  } else {
    stop = checked_int(*p.get(0), "range stop");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  // Counted in 128 bits first, so that neither a huge range nor an overflow gets far.
  __int128 span = step > 0 ? __int128(stop) - start : __int128(start) - stop;
  __int128 count = span <= 0 ? 0 : (span - 1) / (step > 0 ? __int128(step) : -__int128(step)) + 1;
  if (count > __int128(kMaxItems)) fail("range() of {} items is longer than the limit of {}", uint64_t(count), kMaxItems);
  Array out;
  out.reserve(size_t(count));
  for (int64_t k = 0; k < int64_t(count); ++k) out.push_back(int64_t(start + __int128(k) * step));
  return Value(std::move(out));
}

// The namespaces one render made. A namespace can hold itself (ns.me = ns), which shared
// ownership never frees; the render empties them all when it ends, breaking such cycles.
struct Namespaces {
  std::vector<std::shared_ptr<Object>> made;
  ~Namespaces() {
    for (auto& ns : made) {
      auto items = std::move(ns->items);  // released once the namespace no longer holds them
    }
  }
};

Value g_namespace(Namespaces& namespaces, Args& a) {
  auto ns = std::make_shared<Object>();
  ns->is_namespace = true;
  namespaces.made.push_back(ns);
  if (a.positional.size() > 1) fail("namespace takes at most one positional argument");
  if (!a.positional.empty()) {
    if (!a.positional[0].is_object()) fail("namespace expects a dict, got {}", type_name(a.positional[0]));
    for (const auto& [k, v] : a.positional[0].object().items) ns->set(k, v);
  }
  for (auto& [k, v] : a.keyword) ns->set(k, v);
  return Value(std::move(ns));
}

Value g_dict(Args& a) {
  Value d = make_object();
  for (auto& [k, v] : a.keyword) d.object().set(k, v);
  if (!a.positional.empty()) fail("dict() with positional arguments is not supported");
  return d;
}

Value g_raise_exception(Args& a) {
  Params p(a, "raise_exception", {"message"});
  fail("raise_exception: {}", p.get(0) ? to_str(*p.get(0)) : "");
}

Value g_strftime_now(Args& a) {
  Params p(a, "strftime_now", {"format"});
  if (!p.get(0) || !p.get(0)->is_string()) fail("strftime_now expects a format string");
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[256];
  size_t n = std::strftime(buf, sizeof buf, p.get(0)->str().c_str(), &local);
  return derived_string(std::string(buf, n), has_untrusted(*p.get(0)));
}

class Renderer {
 public:
  explicit Renderer(const Scope& root) : root_(&root) {}

  Flow exec(const Body& body, Scope& scope, MarkedText& out) {
    Nested guard(*this);
    for (const auto& node : body) {
      Flow flow = at_line(node->line, [&] { return exec_node(*node, scope, out); });
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

 private:
  const Scope* root_;  // macros see the template's top level, not their caller's locals
  int depth_ = 0;      // statements and expressions being run, one inside the other
  int calls_ = 0;      // macro calls being run, one inside the other
  int64_t iterations_ = 0;
  size_t work_bytes_ = 0;

  // Counts one level of nesting for as long as it lives.
  struct Nested {
    Renderer& r;
    explicit Nested(Renderer& renderer) : r(renderer) {
      if (++r.depth_ > kMaxRenderDepth) {
        --r.depth_;
        fail("the template nests statements and expressions deeper than {} levels", kMaxRenderDepth);
      }
    }
    ~Nested() { --r.depth_; }
  };

  // Every string an expression yields counts towards the render's work.
  void charge(const Value& v) {
    if (!v.is_string()) return;
    work_bytes_ += v.str().size();
    if (work_bytes_ > kMaxWorkBytes) fail("the template computed more than {} bytes of text", kMaxWorkBytes);
  }

  static void check_output(const MarkedText& out) {
    if (out.text.size() > kMaxOutputBytes) fail("the rendered text is longer than the limit of {} bytes", kMaxOutputBytes);
  }

  Flow exec_node(const Node& n, Scope& scope, MarkedText& out) {
    switch (n.kind) {
      case Node::Kind::Text:
        out.append(n.text, false);
        check_output(out);
        return Flow::Normal;
      case Node::Kind::Output:
        append_str(out, eval(*n.expr, scope));
        check_output(out);
        return Flow::Normal;
      case Node::Kind::If:
        for (size_t i = 0; i < n.conditions.size(); ++i)
          if (truthy(eval(*n.conditions[i], scope))) return exec(n.bodies[i], scope, out);
        return exec(n.else_body, scope, out);
      case Node::Kind::For: exec_for(n, scope, out); return Flow::Normal;
      case Node::Kind::Set: exec_set(n, eval(*n.expr, scope), scope); return Flow::Normal;
      case Node::Kind::SetBlock: {
        MarkedText captured;
        exec(n.bodies[0], scope, captured);
        scope.set(n.targets[0], string_value(std::move(captured)));
        return Flow::Normal;
      }
      case Node::Kind::Macro:
        scope.set(n.name, Value(Function{n.name, [this, &n](Args& a) { return call_macro(n, a); }}));
        return Flow::Normal;
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
      case Node::Kind::Block: return exec(n.bodies[0], scope, out);
    }
    return Flow::Normal;
  }

  static void bind_targets(const std::vector<std::string>& targets, const Value& value, Scope& scope) {
    if (targets.size() == 1) {
      scope.set(targets[0], value);
      return;
    }
    Array items = iterate(value);
    if (items.size() != targets.size())
      fail("cannot unpack {} values into {} names", items.size(), targets.size());
    for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], items[i]);
  }

  void exec_set(const Node& n, Value value, Scope& scope) {
    if (n.attribute.empty()) {
      bind_targets(n.targets, value, scope);
      return;
    }
    const Value* ns = scope.find(n.targets[0]);
    if (!ns || !ns->is_object() || !ns->object().is_namespace)
      fail("cannot assign attribute '{}' of '{}': it is not a namespace()", n.attribute, n.targets[0]);
    ns->object().set(n.attribute, std::move(value));
  }

  void count_iteration() {
    if (++iterations_ > kMaxLoopIterations)
      fail("the template's loops ran more than {} iterations", kMaxLoopIterations);
  }

  void exec_for(const Node& n, Scope& scope, MarkedText& out) {
    Value iterable = eval(*n.expr, scope);
    if (iterable.is_none()) fail("'NoneType' object is not iterable");
    Array items = iterate(iterable);
    if (n.condition) {  // `for x in xs if cond`: loop.* counts only the items kept
      Array kept;
      for (auto& item : items) {
        count_iteration();
        Scope filter_scope{&scope, {}};
        bind_targets(n.targets, item, filter_scope);
        if (truthy(eval(*n.condition, filter_scope))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    std::optional<Loop> loop;
    if (n.reads_loop) loop.emplace(items);
    for (size_t i = 0; i < items.size(); ++i) {
      count_iteration();
      Scope iteration{&scope, {}};
      iteration.vars.reserve(n.targets.size() + 1);
      if (loop) {
        loop->advance(items, i);
        iteration.set("loop", loop->value);
      }
      bind_targets(n.targets, items[i], iteration);
      if (exec(n.bodies[0], iteration, out) == Flow::Break) break;
    }
    if (items.empty()) exec(n.else_body, scope, out);
  }

  // One `loop` per run of a for-loop, advanced in place each iteration as Jinja2's
  // LoopContext is: a fresh object per iteration was slow (docs/PERFORMANCE.md#chat-templates).
  struct Loop {
    Value value;
    std::shared_ptr<size_t> position = std::make_shared<size_t>(0);  // read by loop.cycle

    explicit Loop(const Array& items) {
      int64_t n = int64_t(items.size());
      uint32_t deepest = 0;  // previtem and nextitem will hold each item in turn
      for (const Value& item : items) deepest = std::max(deepest, item.nesting());
      value = make_object({{"index", 0}, {"index0", 0}, {"revindex", 0}, {"revindex0", 0},
                           {"first", false}, {"last", false}, {"length", n}, {"depth", 1},
                           {"depth0", 0}, {"previtem", Value()}, {"nextitem", Value()},
                           {"cycle", Value(Function{"loop.cycle", [at = position](Args& a) -> Value {
                              if (a.positional.empty()) fail("loop.cycle needs at least one value");
                              return a.positional[*at % a.positional.size()];
                            }})}});
      Object& o = value.object();
      o.nesting = nesting_around(deepest, "dicts");
      o.holds_untrusted = std::any_of(items.begin(), items.end(), [](const Value& v) { return has_untrusted(v); });
    }
    void advance(const Array& items, size_t i) {
      *position = i;
      int64_t n = int64_t(items.size()), index = int64_t(i);
      auto& f = value.object().items;  // in the order the constructor laid them out
      f[0].second = index + 1;
      f[1].second = index;
      f[2].second = n - index;
      f[3].second = n - index - 1;
      f[4].second = i == 0;
      f[5].second = index == n - 1;
      f[9].second = i > 0 ? items[i - 1] : absent("previtem");
      f[10].second = index + 1 < n ? items[i + 1] : absent("nextitem");
    }
    static Value absent(std::string_view name) {
      return Undefined{fmt::format("'dict object' has no attribute '{}'", name)};
    }
  };

  Value call_macro(const Node& macro, Args& args) {
    if (calls_ >= kMaxCallDepth)
      fail("macro '{}': calls nest deeper than {} (a macro that calls itself without end?)", macro.name, kMaxCallDepth);
    ++calls_;
    struct Leave {
      int& calls;
      ~Leave() { --calls; }
    } leave{calls_};
    if (args.positional.size() > macro.params.size())
      fail("macro '{}' takes {} arguments, got {}", macro.name, macro.params.size(), args.positional.size());
    Scope frame{root_, {}};
    std::vector<bool> bound(macro.params.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      frame.set(macro.params[i].name, args.positional[i]);
      bound[i] = true;
    }
    for (auto& [key, value] : args.keyword) {
      auto it = std::find_if(macro.params.begin(), macro.params.end(), [&name = key](const MacroParam& p) { return p.name == name; });
      if (it == macro.params.end()) fail("macro '{}' got an unexpected argument '{}'", macro.name, key);
      frame.set(key, value);
      bound[size_t(it - macro.params.begin())] = true;
    }
    for (size_t i = 0; i < macro.params.size(); ++i) {
      if (bound[i]) continue;
      const MacroParam& p = macro.params[i];
      frame.set(p.name, p.default_value ? eval(*p.default_value, frame) : Value(Undefined{"'" + p.name + "' is undefined"}));
    }
    MarkedText out;
    exec(macro.bodies[0], frame, out);
    return string_value(std::move(out));
  }

  Args eval_args(const Expr& e, size_t first, Scope& scope) {
    Args args;
    for (size_t i = first; i < e.operands.size(); ++i) args.positional.push_back(eval(*e.operands[i], scope));
    for (const auto& [k, v] : e.keywords) args.keyword.emplace_back(k, eval(*v, scope));
    return args;
  }

  std::optional<int64_t> slice_bound(const ExprPtr& e, Scope& scope) {
    if (!e) return std::nullopt;
    Value v = eval(*e, scope);
    if (v.is_none()) return std::nullopt;
    return checked_int(v, "slice index");
  }

  Value eval(const Expr& e, Scope& scope) {
    Nested guard(*this);
    Value v = at_line(e.line, [&] { return eval_node(e, scope); });
    charge(v);
    return v;
  }

  Value eval_node(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value(Undefined{"'" + e.name + "' is undefined"});
      }
      case Expr::Kind::List: {
        Array items;
        for (const auto& op : e.operands) items.push_back(eval(*op, scope));
        return Value(std::move(items));
      }
      case Expr::Kind::Dict: {
        std::vector<std::pair<std::string, Value>> items;
        bool untrusted_keys = false;
        for (size_t i = 0; i < e.operands.size(); i += 2) {
          Value key = eval(*e.operands[i], scope);
          if (!key.is_string()) fail("dict keys must be strings, got {}", type_name(key));
          untrusted_keys = untrusted_keys || has_untrusted(key);
          Value value = eval(*e.operands[i + 1], scope);
          auto same = std::find_if(items.begin(), items.end(), [&](const auto& item) { return item.first == key.str(); });
          if (same != items.end()) same->second = std::move(value);  // a repeated key keeps its place, as in Python
          else items.emplace_back(key.str(), std::move(value));
        }
        Value d = make_object(std::move(items));
        d.object().untrusted_keys = untrusted_keys;
        return d;
      }
      case Expr::Kind::Attr: return get_attr(eval(*e.operands[0], scope), e.name);
      case Expr::Kind::Item: {
        Value obj = eval(*e.operands[0], scope);
        return get_item(obj, eval(*e.operands[1], scope));
      }
      case Expr::Kind::Slice: {
        Value obj = eval(*e.operands[0], scope);
        if (obj.is_undefined()) fail_undefined(obj);
        auto start = slice_bound(e.operands[1], scope), stop = slice_bound(e.operands[2], scope),
             step = slice_bound(e.operands[3], scope);
        return get_slice(obj, start, stop, step);
      }
      case Expr::Kind::Call: {
        Value callee = eval(*e.operands[0], scope);
        if (callee.is_undefined()) fail_undefined(callee);
        if (!callee.is_function()) fail("'{}' object is not callable", type_name(callee));
        Args args = eval_args(e, 1, scope);
        return callee.function().call(args);
      }
      case Expr::Kind::Filter: {
        Value input = eval(*e.operands[0], scope);
        Args args = eval_args(e, 1, scope);
        return e.filter(input, args);
      }
      case Expr::Kind::Test: {
        Value subject = eval(*e.operands[0], scope);
        Args args = eval_args(e, 1, scope);
        return e.test(subject, args) != e.negated;
      }
      case Expr::Kind::Unary: {
        Value v = eval(*e.operands[0], scope);
        if (e.name == "not") return !truthy(v);
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number()) fail("bad operand type for unary {}: '{}'", e.name, type_name(v));
        if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
        if (!v.is_float() && v.as_int() == INT64_MIN) fail("integer overflow in -({})", v.as_int());
        return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case Expr::Kind::Binary: {
        Value left = eval(*e.operands[0], scope);
        if (e.name == "and") return truthy(left) ? eval(*e.operands[1], scope) : left;
        if (e.name == "or") return truthy(left) ? left : eval(*e.operands[1], scope);
        Value right = eval(*e.operands[1], scope);
        if (e.name == "~") {
          MarkedText out;
          append_str(out, left);
          append_str(out, right);
          check_string_size(out.text.size(), "'~'");
          return string_value(std::move(out));
        }
        return arithmetic(e.name, left, right);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*e.operands[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.operands[i + 1], scope);
          if (!compare_op(e.ops[i], left, right)) return false;
          left = std::move(right);
        }
        return true;
      }
      case Expr::Kind::Condition:
        if (truthy(eval(*e.operands[1], scope))) return eval(*e.operands[0], scope);
        return e.operands[2] ? eval(*e.operands[2], scope) : Value(Undefined{"the if-expression has no else"});
    }
    return Value();
  }
};

}  // namespace

Template::Template(std::string_view source) : body_(std::make_unique<Body>(parse_template(source))) {}
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  return render(context, nlohmann::ordered_json::object()).text;
}

MarkedText Template::render(const nlohmann::ordered_json& trusted, const nlohmann::ordered_json& untrusted) const {
  for (const auto* context : {&trusted, &untrusted})
    if (!context->is_object()) fail("chat template context must be a JSON object, got {}", context->type_name());
  Scope globals;
  globals.set("range", Value(Function{"range", g_range}));
  Namespaces namespaces;  // emptied when the render ends
  globals.set("namespace", Value(Function{"namespace", [&namespaces](Args& a) { return g_namespace(namespaces, a); }}));
  globals.set("dict", Value(Function{"dict", g_dict}));
  globals.set("raise_exception", Value(Function{"raise_exception", g_raise_exception}));
  globals.set("strftime_now", Value(Function{"strftime_now", g_strftime_now}));
  Scope root{&globals, {}};
  for (const auto& [k, v] : untrusted.items()) root.set(k, from_json(v, true));
  for (const auto& [k, v] : trusted.items()) root.set(k, from_json(v, false));
  MarkedText out;
  Renderer(root).exec(*body_, root, out);
  return out;
}

}  // namespace ms::jinja
