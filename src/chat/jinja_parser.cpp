// Lexer and recursive-descent parser following Jinja2 3.1's grammar and whitespace rules.
#include <charconv>
#include <cstdlib>
#include <set>

#include "chat/jinja_ast.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace ms::jinja {
namespace {

template <class... A>
[[noreturn]] void fail_at(int line, fmt::format_string<A...> f, A&&... a) {
  fail("chat template line {}: {}", line, fmt::format(f, std::forward<A>(a)...));
}

struct Token {
  enum class Type { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };
  Type type;
  std::string text;
  int line;
  Value number;
};

// Python's str.isspace over UTF-8: the byte offset after the last non-space character.
size_t rstrip_end(std::string_view s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();)
    if (!is_py_space(next_code_point(s, i))) end = i;
  return end;
}

// Byte offset of the first non-space character at or after pos.
size_t skip_space(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    size_t next = pos;
    if (!is_py_space(next_code_point(s, next))) break;
    pos = next;
  }
  return pos;
}

int count_newlines(std::string_view s) { return int(std::count(s.begin(), s.end(), '\n')); }

// Jinja2 normalises \r\n and \r to \n and drops one trailing newline (keep_trailing_newline off).
std::string normalize_source(std::string_view in) {
  std::string s;
  s.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      s += '\n';
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      s += in[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize_source(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag_start();
      if (tag == std::string::npos) {
        emit(Token::Type::Text, src_.substr(pos_));
        break;
      }
      lex_text_before(tag);
      char kind = src_[tag + 1];
      pos_ = tag + 2;
      char modifier = pos_ < src_.size() ? src_[pos_] : 0;
      if (modifier == '-' || modifier == '+') ++pos_;
      if (kind == '#')
        lex_comment();
      else
        lex_tag(kind == '{');
    }
    tokens_.push_back({Token::Type::Eof, "", line_, {}});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  // Whether the last thing consumed ended a line; lstrip_blocks then applies to the first tag
  // of the new line even though the text before it holds no newline.
  bool line_starting_ = true;
  std::vector<Token> tokens_;

  void emit(Token::Type type, std::string text, Value number = {}) {
    tokens_.push_back({type, std::move(text), line_, std::move(number)});
  }

  size_t find_tag_start() const {
    for (size_t p = src_.find('{', pos_); p != std::string::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    return std::string::npos;
  }

  // The text before a tag, with `{%-`-style stripping or lstrip_blocks applied.
  void lex_text_before(size_t tag) {
    std::string text = src_.substr(pos_, tag - pos_);
    int newlines = count_newlines(text);
    char kind = src_[tag + 1];
    char modifier = tag + 2 < src_.size() ? src_[tag + 2] : 0;
    if (modifier == '-') {
      text.resize(rstrip_end(text));
    } else if (modifier != '+' && kind != '{') {
      size_t line_start = text.rfind('\n');
      line_start = line_start == std::string::npos ? 0 : line_start + 1;
      bool only_blanks = line_start < text.size() && skip_space(text, line_start) == text.size();
      if ((line_start > 0 || line_starting_) && only_blanks) text.resize(line_start);
    }
    if (!text.empty()) emit(Token::Type::Text, std::move(text));
    line_ += newlines;
    line_starting_ = false;
  }

  // After `%}` or `#}`: `-` strips all whitespace, otherwise trim_blocks drops one newline.
  void after_tag_end(char modifier) {
    size_t start = pos_;
    if (modifier == '-')
      pos_ = skip_space(src_, pos_);
    else if (modifier != '+' && pos_ < src_.size() && src_[pos_] == '\n')
      ++pos_;
    line_ += count_newlines(std::string_view(src_).substr(start, pos_ - start));
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
  }

  void lex_comment() {
    int start_line = line_;
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail_at(start_line, "comment '{{#' is never closed with '#}}'");
    char modifier = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    line_ += count_newlines(std::string_view(src_).substr(pos_, end - pos_));
    pos_ = end + 2;
    after_tag_end(modifier);
  }

  void lex_tag(bool is_variable) {
    int start_line = line_;
    emit(is_variable ? Token::Type::VarBegin : Token::Type::BlockBegin, "");
    const char* close = is_variable ? "}}" : "%}";
    int depth = 0;
    for (;;) {
      size_t next = skip_space(src_, pos_);
      line_ += count_newlines(std::string_view(src_).substr(pos_, next - pos_));
      pos_ = next;
      if (pos_ >= src_.size())
        fail_at(start_line, "tag '{}' is never closed with '{}'", is_variable ? "{{" : "{%", close);
      if (depth == 0) {
        char modifier = src_[pos_] == '-' || (!is_variable && src_[pos_] == '+') ? src_[pos_] : 0;
        if (src_.compare(pos_ + (modifier ? 1 : 0), 2, close) == 0) {
          pos_ += 2 + (modifier ? 1 : 0);
          emit(is_variable ? Token::Type::VarEnd : Token::Type::BlockEnd, "");
          if (is_variable) {
            size_t start = pos_;
            if (modifier == '-') pos_ = skip_space(src_, pos_);
            line_ += count_newlines(std::string_view(src_).substr(start, pos_ - start));
            line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
          } else {
            after_tag_end(modifier);
          }
          return;
        }
      }
      lex_expression_token(depth);
    }
  }

  void lex_expression_token(int& depth) {
    char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos_;
      while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      emit(Token::Type::Name, src_.substr(pos_, end - pos_));
      pos_ = end;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number();
    } else if (c == '\'' || c == '"') {
      lex_string();
    } else {
      static const char* two_char_ops[] = {"//", "**", "==", "!=", "<=", ">="};
      for (const char* op : two_char_ops)
        if (src_.compare(pos_, 2, op) == 0) {
          emit(Token::Type::Op, op);
          pos_ += 2;
          return;
        }
      if (std::string_view("+-*/%~()[]{},.:|=<>").find(c) == std::string_view::npos)
        fail_at(line_, "unexpected character '{}'", c);
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) fail_at(line_, "unexpected '{}'", c);
        --depth;
      }
      emit(Token::Type::Op, std::string(1, c));
      ++pos_;
    }
  }

  void lex_number() {
    size_t end = pos_;
    auto digits = [&] {
      while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
    };
    digits();
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' && std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      ++end;
      digits();
      is_float = true;
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t exp = end + 1;
      if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
      if (exp < src_.size() && std::isdigit(static_cast<unsigned char>(src_[exp]))) {
        end = exp;
        digits();
        is_float = true;
      }
    }
    std::string text = src_.substr(pos_, end - pos_);
    std::erase(text, '_');
    pos_ = end;
    if (is_float) {
      // As Python reads it: too large is inf, too small is 0 (strtod's ERANGE results).
      emit(Token::Type::Float, text, Value(std::strtod(text.c_str(), nullptr)));
    } else {
      int64_t v = 0;
      auto res = std::from_chars(text.data(), text.data() + text.size(), v);
      if (res.ec != std::errc()) fail_at(line_, "integer literal {} is out of range", text);
      emit(Token::Type::Int, text, Value(v));
    }
  }

  // Python string-literal escapes; an unknown escape keeps its backslash, as Python does.
  void lex_string() {
    int start_line = line_;
    char quote = src_[pos_++];
    std::string value;
    for (;;) {
      if (pos_ >= src_.size()) fail_at(start_line, "string literal is never closed");
      char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || pos_ >= src_.size()) {
        value += c;
        continue;
      }
      char e = src_[pos_++];
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case 'a': value += '\a'; break;
        case '0': value += '\0'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': ++line_; break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          auto res = std::from_chars(src_.data() + pos_, src_.data() + std::min(pos_ + n, src_.size()), cp, 16);
          if (res.ec != std::errc() || res.ptr != src_.data() + pos_ + n)
            fail_at(line_, "malformed \\{} escape in string literal", e);
          utf8::append(value, char32_t(cp));
          pos_ += n;
          break;
        }
        default:
          value += '\\';
          value += e;
      }
    }
    emit(Token::Type::String, std::move(value));
  }
};

// How deeply a template may nest: expressions (operators, brackets, calls, filters) and
// statements (if, for, macro, set blocks). Real templates nest a few levels; the limits keep
// parsing and rendering a hostile one off the end of the stack.
constexpr int kMaxExprDepth = 100;
constexpr int kMaxStatementDepth = 60;
constexpr int kMaxParseRecursion = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = parse_body({});
    if (peek().type != Token::Type::Eof) fail_at(peek().line, "unexpected tag");
    return body;
  }

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int loop_reads_ = 0;  // names `loop` parsed so far: a for body without one needs no loop object
  int statement_depth_ = 0;
  int recursion_ = 0;

  // Counts one level of parser recursion (brackets, unary chains) for as long as it lives.
  struct Recursion {
    int& depth;
    int limit;
    const char* what;
    int line;
    Recursion(int& d, int l, const char* w, int at) : depth(d), limit(l), what(w), line(at) {
      if (++depth > limit) fail_at(line, "{} nest deeper than {} levels", what, limit);
    }
    ~Recursion() { --depth; }
  };

  // Sets e's depth from its operands'; fails beyond kMaxExprDepth.
  static ExprPtr sized(ExprPtr e) {
    int deepest = 0;
    for (const auto& op : e->operands)
      if (op) deepest = std::max(deepest, op->depth);
    for (const auto& [k, v] : e->keywords) deepest = std::max(deepest, v->depth);
    e->depth = deepest + 1;
    if (e->depth > kMaxExprDepth) fail_at(e->line, "expressions nest deeper than {} levels", kMaxExprDepth);
    return e;
  }

  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool at_op(std::string_view op) const { return peek().type == Token::Type::Op && peek().text == op; }
  bool at_name(std::string_view name) const { return peek().type == Token::Type::Name && peek().text == name; }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    ++pos_;
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::Type::Text: return "text";
      case Token::Type::VarBegin: return "'{{'";
      case Token::Type::VarEnd: return "'}}'";
      case Token::Type::BlockBegin: return "'{%'";
      case Token::Type::BlockEnd: return "'%}'";
      case Token::Type::Eof: return "end of template";
      case Token::Type::String: return "string literal";
      default: return "'" + t.text + "'";
    }
  }

  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_at(peek().line, "expected '{}', found {}", op, describe(peek()));
  }
  void expect(Token::Type type, std::string_view what) {
    if (peek().type != type) fail_at(peek().line, "expected {}, found {}", what, describe(peek()));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().type != Token::Type::Name) fail_at(peek().line, "expected a name, found {}", describe(peek()));
    return next().text;
  }
  void expect_block_end() { expect(Token::Type::BlockEnd, "'%}'"); }

  // Statements until a `{% name %}` with name in `ends` (left unconsumed) or end of input.
  Body parse_body(const std::set<std::string>& ends) {
    Body body;
    for (;;) {
      const Token& t = peek();
      if (t.type == Token::Type::Eof) return body;
      if (t.type == Token::Type::Text) {
        body.push_back(make_node(Node::Kind::Text, t.line));
        body.back()->text = next().text;
      } else if (t.type == Token::Type::VarBegin) {
        ++pos_;
        auto node = make_node(Node::Kind::Output, t.line);
        node->expr = parse_tuple(true);
        expect(Token::Type::VarEnd, "'}}'");
        body.push_back(std::move(node));
      } else if (t.type == Token::Type::BlockBegin) {
        const Token& keyword = peek(1);
        if (keyword.type != Token::Type::Name) fail_at(keyword.line, "expected a tag name, found {}", describe(keyword));
        if (ends.count(keyword.text)) return body;
        ++pos_;
        body.push_back(parse_statement());
      } else {
        fail_at(t.line, "unexpected {}", describe(t));
      }
    }
  }

  static std::unique_ptr<Node> make_node(Node::Kind kind, int line) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = line;
    return n;
  }

  // Parses a body and the closing tag; returns which of `ends` closed it.
  std::string parse_until(Body& body, const std::set<std::string>& ends, std::string_view opener, int line) {
    body = parse_body(ends);
    if (peek().type == Token::Type::Eof) {
      std::string names;
      for (const auto& e : ends) names += (names.empty() ? "'" : " or '") + e + "'";
      fail_at(line, "'{}' is never closed (expected {})", opener, names);
    }
    ++pos_;  // {%
    return next().text;
  }

  std::unique_ptr<Node> parse_statement() {
    const Token& keyword = next();
    int line = keyword.line;
    Recursion guard(statement_depth_, kMaxStatementDepth, "statements", line);
    const std::string& k = keyword.text;
    if (k == "if") return parse_if(line);
    if (k == "for") return parse_for(line);
    if (k == "set") return parse_set(line);
    if (k == "macro") return parse_macro(line);
    if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail_at(line, "'{}' outside of a for loop", k);
      expect_block_end();
      return make_node(k == "break" ? Node::Kind::Break : Node::Kind::Continue, line);
    }
    if (k == "generation") {
      auto node = make_node(Node::Kind::Block, line);
      expect_block_end();
      node->bodies.emplace_back();
      parse_until(node->bodies[0], {"endgeneration"}, "generation", line);
      expect_block_end();
      return node;
    }
    static const std::set<std::string> unsupported = {"include", "import", "from", "extends", "block", "call",
                                                      "filter", "raw", "with", "do", "autoescape"};
    if (unsupported.count(k)) fail_at(line, "unsupported tag '{}'", k);
    if (k.starts_with("end") || k == "else" || k == "elif") fail_at(line, "unexpected '{}'", k);
    fail_at(line, "unknown tag '{}'", k);
  }

  std::unique_ptr<Node> parse_if(int line) {
    auto node = make_node(Node::Kind::If, line);
    for (;;) {
      node->conditions.push_back(parse_tuple(false));
      expect_block_end();
      node->bodies.emplace_back();
      std::string end = parse_until(node->bodies.back(), {"elif", "else", "endif"}, "if", line);
      if (end == "elif") continue;
      if (end == "else") {
        expect_block_end();
        parse_until(node->else_body, {"endif"}, "if", line);
      }
      expect_block_end();
      return node;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    do names.push_back(expect_name());
    while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  std::unique_ptr<Node> parse_for(int line) {
    auto node = make_node(Node::Kind::For, line);
    node->targets = parse_targets();
    if (!skip_name("in")) fail_at(peek().line, "expected 'in' in for loop, found {}", describe(peek()));
    node->expr = parse_tuple(false);
    if (skip_name("if")) node->condition = parse_expression(true);
    if (at_name("recursive")) fail_at(line, "unsupported construct 'recursive' loop");
    expect_block_end();
    node->bodies.emplace_back();
    ++loop_depth_;
    int reads_before = loop_reads_;
    std::string end = parse_until(node->bodies[0], {"else", "endfor"}, "for", line);
    node->reads_loop = loop_reads_ != reads_before;
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      parse_until(node->else_body, {"endfor"}, "for", line);
    }
    expect_block_end();
    return node;
  }

  std::unique_ptr<Node> parse_set(int line) {
    auto node = make_node(Node::Kind::Set, line);
    if (peek().type == Token::Type::Name && peek(1).type == Token::Type::Op && peek(1).text == ".") {
      node->targets.push_back(next().text);
      ++pos_;
      node->attribute = expect_name();
    } else {
      node->targets = parse_targets();
    }
    if (skip_op("=")) {
      node->expr = parse_tuple(true);
      expect_block_end();
      return node;
    }
    if (at_op("|")) fail_at(line, "unsupported construct: filter on a block set");
    if (node->targets.size() != 1 || !node->attribute.empty())
      fail_at(line, "a block set assigns exactly one plain name");
    expect_block_end();
    node->kind = Node::Kind::SetBlock;
    node->bodies.emplace_back();
    parse_until(node->bodies[0], {"endset"}, "set", line);
    expect_block_end();
    return node;
  }

  std::unique_ptr<Node> parse_macro(int line) {
    auto node = make_node(Node::Kind::Macro, line);
    node->name = expect_name();
    expect_op("(");
    while (!skip_op(")")) {
      if (!node->params.empty()) expect_op(",");
      MacroParam p{expect_name(), nullptr};
      if (skip_op("=")) p.default_value = parse_expression(true);
      node->params.push_back(std::move(p));
    }
    expect_block_end();
    node->bodies.emplace_back();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;  // a macro body cannot break out of the caller's loop
    parse_until(node->bodies[0], {"endmacro"}, "macro", line);
    loop_depth_ = saved_loop_depth;
    if (peek().type == Token::Type::Name) ++pos_;  // {% endmacro name %}
    expect_block_end();
    return node;
  }

  // ---- expressions, in Jinja2's precedence order ----

  static ExprPtr make_expr(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  static ExprPtr binary(std::string op, ExprPtr left, ExprPtr right) {
    auto e = make_expr(Expr::Kind::Binary, left->line);
    e->name = std::move(op);
    e->operands.push_back(std::move(left));
    e->operands.push_back(std::move(right));
    return sized(std::move(e));
  }

  ExprPtr parse_tuple(bool with_condition) {
    int line = peek().line;
    ExprPtr first = parse_expression(with_condition);
    if (!at_op(",")) return first;
    auto list = make_expr(Expr::Kind::List, line);
    list->operands.push_back(std::move(first));
    while (skip_op(",")) {
      if (peek().type == Token::Type::BlockEnd || peek().type == Token::Type::VarEnd || at_op(")")) break;
      list->operands.push_back(parse_expression(with_condition));
    }
    return sized(std::move(list));
  }

  ExprPtr parse_expression(bool with_condition) {
    Recursion guard(recursion_, kMaxParseRecursion, "expressions", peek().line);
    return with_condition ? parse_condition() : parse_or();
  }

  ExprPtr parse_condition() {
    Recursion guard(recursion_, kMaxParseRecursion, "expressions", peek().line);
    ExprPtr value = parse_or();
    while (skip_name("if")) {
      auto e = make_expr(Expr::Kind::Condition, value->line);
      e->operands.push_back(std::move(value));
      e->operands.push_back(parse_or());
      e->operands.push_back(skip_name("else") ? parse_condition() : nullptr);
      value = sized(std::move(e));
    }
    return value;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary("or", std::move(left), parse_and());
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary("and", std::move(left), parse_not());
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      Recursion guard(recursion_, kMaxParseRecursion, "expressions", peek().line);
      auto e = make_expr(Expr::Kind::Unary, next().line);
      e->name = "not";
      e->operands.push_back(parse_not());
      return sized(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      if (peek().type == Token::Type::Op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (at_name("not") && peek(1).type == Token::Type::Name && peek(1).text == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(Expr::Kind::Compare, first->line);
        cmp->operands.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->operands.push_back(parse_math1());
    }
    return cmp ? sized(std::move(cmp)) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      std::string op = next().text;
      left = binary(op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (skip_op("~")) left = binary("~", std::move(left), parse_math2());
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = next().text;
      left = binary(op, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = binary("**", std::move(left), parse_unary(true));
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      Recursion guard(recursion_, kMaxParseRecursion, "expressions", peek().line);
      e = make_expr(Expr::Kind::Unary, peek().line);
      e->name = next().text;
      e->operands.push_back(parse_unary(false));
      e = sized(std::move(e));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr literal(Value v, int line) {
    auto e = make_expr(Expr::Kind::Literal, line);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    int line = t.line;
    switch (t.type) {
      case Token::Type::Name: {
        std::string name = next().text;
        if (name == "true" || name == "True") return literal(true, line);
        if (name == "false" || name == "False") return literal(false, line);
        if (name == "none" || name == "None") return literal(nullptr, line);
        if (name == "loop") ++loop_reads_;
        auto e = make_expr(Expr::Kind::Name, line);
        e->name = std::move(name);
        return e;
      }
      case Token::Type::String: {
        std::string s;
        while (peek().type == Token::Type::String) s += next().text;  // adjacent literals join
        return literal(std::move(s), line);
      }
      case Token::Type::Int:
      case Token::Type::Float: return literal(next().number, line);
      case Token::Type::Op:
        if (skip_op("(")) {
          if (skip_op(")")) return make_expr(Expr::Kind::List, line);  // empty tuple
          ExprPtr inner = parse_tuple(true);
          expect_op(")");
          return inner;
        }
        if (skip_op("[")) {
          auto list = make_expr(Expr::Kind::List, line);
          while (!skip_op("]")) {
            if (!list->operands.empty()) {
              expect_op(",");
              if (skip_op("]")) break;
            }
            list->operands.push_back(parse_expression(true));
          }
          return sized(std::move(list));
        }
        if (skip_op("{")) {
          auto dict = make_expr(Expr::Kind::Dict, line);
          while (!skip_op("}")) {
            if (!dict->operands.empty()) {
              expect_op(",");
              if (skip_op("}")) break;
            }
            dict->operands.push_back(parse_expression(true));
            expect_op(":");
            dict->operands.push_back(parse_expression(true));
          }
          return sized(std::move(dict));
        }
        [[fallthrough]];
      default: fail_at(line, "unexpected {} in expression", describe(t));
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      int line = peek().line;
      if (skip_op(".")) {
        if (peek().type == Token::Type::Int) {
          auto item = make_expr(Expr::Kind::Item, line);
          item->operands.push_back(std::move(e));
          item->operands.push_back(literal(next().number, line));
          e = sized(std::move(item));
        } else {
          auto attr = make_expr(Expr::Kind::Attr, line);
          attr->name = expect_name();
          attr->operands.push_back(std::move(e));
          e = sized(std::move(attr));
        }
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    for (int i = 0; i < 3; ++i) {
      if (!at_op(":") && !at_op("]")) parts[i] = parse_expression(true);
      if (i < 2 && skip_op(":")) {
        is_slice = true;
        continue;
      }
      break;
    }
    expect_op("]");
    auto e = make_expr(is_slice ? Expr::Kind::Slice : Expr::Kind::Item, line);
    e->operands.push_back(std::move(target));
    if (!is_slice && !parts[0]) fail_at(line, "empty subscript");
    for (int i = 0; i < (is_slice ? 3 : 1); ++i) e->operands.push_back(std::move(parts[i]));
    return sized(std::move(e));
  }

  // `(args)` appended to e's operands and keywords.
  void parse_args(Expr& e) {
    expect_op("(");
    for (bool first = true; !skip_op(")"); first = false) {
      if (!first) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      if (at_op("*") || at_op("**")) fail_at(peek().line, "unsupported construct: *args or **kwargs in a call");
      if (peek().type == Token::Type::Name && peek(1).type == Token::Type::Op && peek(1).text == "=") {
        std::string key = next().text;
        ++pos_;
        e.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.keywords.empty()) fail_at(peek().line, "positional argument after keyword argument");
        e.operands.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make_expr(Expr::Kind::Call, callee->line);
    e->operands.push_back(std::move(callee));
    parse_args(*e);
    return sized(std::move(e));
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (at_op("|")) {
        int line = next().line;
        auto f = make_expr(Expr::Kind::Filter, line);
        f->name = expect_name();
        f->filter = find_filter(f->name);
        if (!f->filter) fail_at(line, "unknown filter '{}'", f->name);
        f->operands.push_back(std::move(e));
        if (at_op("(")) parse_args(*f);
        e = sized(std::move(f));
      } else if (at_name("is")) {
        e = parse_test(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr subject) {
    int line = next().line;
    auto t = make_expr(Expr::Kind::Test, line);
    t->negated = skip_name("not");
    t->name = expect_name();
    t->test = find_test(t->name);
    if (!t->test) fail_at(line, "unknown test '{}'", t->name);
    t->operands.push_back(std::move(subject));
    if (at_op("(")) {
      parse_args(*t);
    } else if ((peek().type == Token::Type::Name || peek().type == Token::Type::String ||
                peek().type == Token::Type::Int || peek().type == Token::Type::Float || at_op("(") ||
                at_op("[") || at_op("{")) &&
               !at_name("else") && !at_name("or") && !at_name("and")) {
      if (at_name("is")) fail_at(line, "tests cannot be chained with 'is'");
      t->operands.push_back(parse_postfix(parse_primary()));
    }
    return sized(std::move(t));
  }
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(Lexer(source).run()).parse(); }

}  // namespace ms::jinja
