#include "engine/chat/jinja_parser.h"

#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_builtins.h"
#include "engine/chat/jinja_lexer.h"
#include "engine/status_macros.h"

namespace strata::chat::jinja {
namespace {

using K = Token::Kind;

// Statements and expressions nested deeper than this are refused (the parser and the interpreter recurse
// once per level; a hostile template must not exhaust the stack).
constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseAll() {
    std::string end;
    ASSIGN_OR_RETURN(Body body, ParseBody({}, &end));
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& Next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == K::kOp && Peek(ahead).value == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == K::kName && Peek(ahead).value == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }

  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case K::kText:
        return "template text";
      case K::kVarBegin:
        return "'{{'";
      case K::kVarEnd:
        return "'}}'";
      case K::kBlockBegin:
        return "'{%'";
      case K::kBlockEnd:
        return "'%}'";
      case K::kEof:
        return "the end of the template";
      case K::kString:
        return "a string";
      default:
        return Cat("'", t.value, "'");
    }
  }
  absl::Status Error(const Token& at, std::string_view what) const {
    return absl::InvalidArgumentError(Cat("line ", at.line, ": ", what));
  }
  absl::Status Expected(std::string_view what) const {
    return Error(Peek(), Cat("expected ", what, ", found ", Describe(Peek())));
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!SkipOp(op)) return Expected(Cat("'", op, "'"));
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().kind != K::kBlockEnd) return Expected("'%}'");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != K::kName) return Expected("a name");
    return Next().value;
  }

  // Statements until a {% tag %} named in `ends` (consumed up to and including its name, which goes to
  // *end) or, when `ends` is empty, the end of the template.
  absl::StatusOr<Body> ParseBody(std::vector<std::string_view> ends, std::string* end) {
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.kind == K::kEof) {
        if (ends.empty()) return body;
        return Error(t, Cat("missing {% ", ends.back(), " %}"));
      }
      if (t.kind == K::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->text = Next().value;
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind == K::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = Next().line;
        ASSIGN_OR_RETURN(s->expr, ParseExpression());
        if (Peek().kind != K::kVarEnd) return Expected("'}}'");
        Next();
        body.push_back(std::move(s));
        continue;
      }
      if (t.kind != K::kBlockBegin) return Error(t, Cat("unexpected ", Describe(t)));
      Next();
      const Token& name = Peek();
      if (name.kind != K::kName) return Expected("a tag name");
      for (std::string_view e : ends) {
        if (name.value == e) {
          *end = Next().value;
          return body;
        }
      }
      ASSIGN_OR_RETURN(std::unique_ptr<Stmt> s, ParseStatement());
      body.push_back(std::move(s));
    }
  }

  // Counts one level of nesting for as long as it lives.
  struct Nest {
    explicit Nest(int* depth) : depth(depth) { ++*depth; }
    ~Nest() { --*depth; }
    int* depth;
  };
  absl::Status CheckNesting() const {
    if (depth_ > kMaxNesting) return Error(Peek(), Cat("nesting deeper than ", kMaxNesting, " levels"));
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement() {
    const Nest nest(&depth_);
    RETURN_IF_ERROR(CheckNesting());
    const Token tag = Next();
    auto s = std::make_unique<Stmt>();
    s->line = tag.line;
    std::string end;
    if (tag.value == "if") {
      s->kind = Stmt::Kind::kIf;
      std::string keyword = "if";
      while (keyword == "if" || keyword == "elif") {
        ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, &keyword));
        s->branches.emplace_back(std::move(cond), std::move(body));
      }
      if (keyword == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, &end));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (tag.value == "for") {
      s->kind = Stmt::Kind::kFor;
      do {
        ASSIGN_OR_RETURN(std::string target, ExpectName());
        s->targets.push_back(std::move(target));
      } while (SkipOp(","));
      if (!SkipName("in")) return Expected("'in'");
      ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/false));
      if (SkipName("if")) {
        ASSIGN_OR_RETURN(s->filter, ParseExpression());
      }
      if (IsName("recursive")) return Error(Peek(), "unsupported: recursive for loops");
      RETURN_IF_ERROR(ExpectBlockEnd());
      std::string keyword;
      ASSIGN_OR_RETURN(s->body, ParseBody({"else", "endfor"}, &keyword));
      if (keyword == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &end));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (tag.value == "set") {
      ASSIGN_OR_RETURN(std::string target, ExpectName());
      s->targets.push_back(std::move(target));
      if (SkipOp(".")) {
        ASSIGN_OR_RETURN(s->attribute, ExpectName());
      } else {
        while (SkipOp(",")) {
          ASSIGN_OR_RETURN(std::string more, ExpectName());
          s->targets.push_back(std::move(more));
        }
      }
      if (SkipOp("=")) {
        s->kind = Stmt::Kind::kSet;
        ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/true));
        RETURN_IF_ERROR(ExpectBlockEnd());
      } else {
        if (s->targets.size() != 1 || !s->attribute.empty()) return Error(tag, "a {% set %} block sets one name");
        s->kind = Stmt::Kind::kSetBlock;
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, &end));
        RETURN_IF_ERROR(ExpectBlockEnd());
      }
    } else if (tag.value == "macro") {
      s->kind = Stmt::Kind::kMacro;
      ASSIGN_OR_RETURN(s->name, ExpectName());
      RETURN_IF_ERROR(ExpectOp("("));
      while (!IsOp(")")) {
        if (!s->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
        ASSIGN_OR_RETURN(std::string param, ExpectName());
        ExprPtr def;
        if (SkipOp("=")) {
          ASSIGN_OR_RETURN(def, ParseExpression());
        }
        s->params.emplace_back(std::move(param), std::move(def));
      }
      Next();
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->body, ParseBody({"endmacro"}, &end));
      if (Peek().kind == K::kName && Peek().value == s->name) Next();
      RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (tag.value == "break" || tag.value == "continue") {
      s->kind = tag.value == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      RETURN_IF_ERROR(ExpectBlockEnd());
    } else if (tag.value == "generation") {
      s->kind = Stmt::Kind::kBlock;
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
    } else {
      return Error(tag, Cat("unsupported tag {% ", tag.value, " %}"));
    }
    return s;
  }

  static ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  static ExprPtr MakeBinary(Expr::Kind kind, std::string op, ExprPtr a, ExprPtr b) {
    ExprPtr e = Make(kind, a->line);
    e->name = std::move(op);
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  // Expressions separated by commas: a tuple (a list here) when there is a comma.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr) {
    const int line = Peek().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (with_condexpr) {
        ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
        items.push_back(std::move(e));
      } else {
        ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
        items.push_back(std::move(e));
      }
      if (!SkipOp(",")) break;
      comma = true;
      if (Peek().kind == K::kBlockEnd || Peek().kind == K::kVarEnd || IsName("if")) break;
    }
    if (!comma) return std::move(items[0]);
    ExprPtr list = Make(Expr::Kind::kList, line);
    list->children = std::move(items);
    return list;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    const Nest nest(&depth_);
    RETURN_IF_ERROR(CheckNesting());
    ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (SkipName("if")) {
      ExprPtr cond_expr = Make(Expr::Kind::kCond, expr->line);
      ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(otherwise, ParseExpression());
      }
      cond_expr->children.push_back(std::move(expr));
      cond_expr->children.push_back(std::move(cond));
      cond_expr->children.push_back(std::move(otherwise));
      expr = std::move(cond_expr);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (SkipName("or")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = MakeBinary(Expr::Kind::kOr, "or", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (SkipName("and")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = MakeBinary(Expr::Kind::kAnd, "and", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const int line = Next().line;
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      ExprPtr e = Make(Expr::Kind::kNot, line);
      e->children.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Peek().kind == K::kOp && (Peek().value == "==" || Peek().value == "!=" || Peek().value == "<" ||
                                    Peek().value == ">" || Peek().value == "<=" || Peek().value == ">=")) {
        op = Next().value;
      } else if (SkipName("in")) {
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (cmp == nullptr) {
        cmp = Make(Expr::Kind::kCompare, first->line);
        cmp->children.push_back(std::move(first));
      }
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      cmp->ops.push_back(std::move(op));
      cmp->children.push_back(std::move(right));
    }
    return cmp != nullptr ? std::move(cmp) : std::move(first);
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      std::string op = Next().value;
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = MakeBinary(Expr::Kind::kBinary, std::move(op), std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (SkipOp("~")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      left = MakeBinary(Expr::Kind::kBinary, "~", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Next().value;
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = MakeBinary(Expr::Kind::kBinary, std::move(op), std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (SkipOp("**")) {
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = MakeBinary(Expr::Kind::kBinary, "**", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    const Nest nest(&depth_);
    RETURN_IF_ERROR(CheckNesting());
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token op = Next();
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = Make(op.value == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, op.line);
      node->children.push_back(std::move(operand));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (!with_filter) return node;
    while (true) {
      if (SkipOp("|")) {
        ExprPtr f = Make(Expr::Kind::kFilter, node->line);
        const Token name_token = Peek();
        ASSIGN_OR_RETURN(f->name, ExpectName());
        if (!IsKnownFilter(f->name)) return Error(name_token, Cat("unsupported filter '", f->name, "'"));
        if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(&f->args));
        f->children.push_back(std::move(node));
        node = std::move(f);
      } else if (SkipName("is")) {
        ExprPtr t = Make(Expr::Kind::kTest, node->line);
        t->negated = SkipName("not");
        const Token name_token = Peek();
        ASSIGN_OR_RETURN(t->name, ExpectName());
        if (!IsKnownTest(t->name)) return Error(name_token, Cat("unsupported test '", t->name, "'"));
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseCallArgs(&t->args));
        } else if ((Peek().kind == K::kName || Peek().kind == K::kString || Peek().kind == K::kInt ||
                    Peek().kind == K::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->args.push_back({"", std::move(arg)});
        }
        t->children.push_back(std::move(node));
        node = std::move(t);
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token t = Next();
    switch (t.kind) {
      case K::kName: {
        ExprPtr e = Make(Expr::Kind::kLiteral, t.line);
        if (t.value == "true" || t.value == "True") {
          e->literal = Value::Bool(true);
        } else if (t.value == "false" || t.value == "False") {
          e->literal = Value::Bool(false);
        } else if (t.value == "none" || t.value == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.value;
        }
        return e;
      }
      case K::kString: {
        std::string s = t.value;
        while (Peek().kind == K::kString) s += Next().value;  // adjacent literals concatenate
        ExprPtr e = Make(Expr::Kind::kLiteral, t.line);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case K::kInt: {
        ExprPtr e = Make(Expr::Kind::kLiteral, t.line);
        e->literal = Value::Int(std::strtoll(t.value.c_str(), nullptr, 10));
        return e;
      }
      case K::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral, t.line);
        e->literal = Value::Float(std::strtod(t.value.c_str(), nullptr));
        return e;
      }
      case K::kOp:
        if (t.value == "(") {
          if (SkipOp(")")) return Make(Expr::Kind::kList, t.line);  // ()
          ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple(/*with_condexpr=*/true));
          RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (t.value == "[") {
          ExprPtr list = Make(Expr::Kind::kList, t.line);
          while (!IsOp("]")) {
            if (!list->children.empty()) {
              RETURN_IF_ERROR(ExpectOp(","));
              if (IsOp("]")) break;
            }
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
            list->children.push_back(std::move(item));
          }
          Next();
          return list;
        }
        if (t.value == "{") {
          ExprPtr dict = Make(Expr::Kind::kDict, t.line);
          while (!IsOp("}")) {
            if (!dict->children.empty()) {
              RETURN_IF_ERROR(ExpectOp(","));
              if (IsOp("}")) break;
            }
            ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
            RETURN_IF_ERROR(ExpectOp(":"));
            ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
            dict->children.push_back(std::move(key));
            dict->children.push_back(std::move(value));
          }
          Next();
          return dict;
        }
        break;
      default:
        break;
    }
    return Error(t, Cat("unexpected ", Describe(t), " in an expression"));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (SkipOp(".")) {
        const Token t = Next();
        if (t.kind == K::kInt) {
          ExprPtr item = Make(Expr::Kind::kItem, t.line);
          ExprPtr index = Make(Expr::Kind::kLiteral, t.line);
          index->literal = Value::Int(std::strtoll(t.value.c_str(), nullptr, 10));
          item->children.push_back(std::move(node));
          item->children.push_back(std::move(index));
          node = std::move(item);
          continue;
        }
        if (t.kind != K::kName) return Error(t, Cat("expected an attribute name, found ", Describe(t)));
        ExprPtr attr = Make(Expr::Kind::kAttr, t.line);
        attr->name = t.value;
        attr->children.push_back(std::move(node));
        node = std::move(attr);
      } else if (IsOp("[")) {
        const int line = Next().line;
        ExprPtr parts[3];
        bool slice = false;
        for (int i = 0; i < 3; ++i) {
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[i], ParseExpression());
          }
          if (i < 2 && SkipOp(":")) {
            slice = true;
          } else {
            break;
          }
        }
        RETURN_IF_ERROR(ExpectOp("]"));
        if (!slice && parts[0] == nullptr) return Error(Peek(), "empty subscript []");
        ExprPtr e = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
        e->children.push_back(std::move(node));
        e->children.push_back(std::move(parts[0]));
        if (slice) {
          e->children.push_back(std::move(parts[1]));
          e->children.push_back(std::move(parts[2]));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    ExprPtr call = Make(Expr::Kind::kCall, callee->line);
    RETURN_IF_ERROR(ParseCallArgs(&call->args));
    call->children.push_back(std::move(callee));
    return call;
  }

  absl::Status ParseCallArgs(std::vector<Arg>* args) {
    RETURN_IF_ERROR(ExpectOp("("));
    bool keyword_seen = false;
    while (!IsOp(")")) {
      if (!args->empty()) {
        RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) return Error(Peek(), "unsupported: *args and **kwargs in calls");
      Arg arg;
      if (Peek().kind == K::kName && IsOp("=", 1)) {
        arg.name = Next().value;
        Next();
        keyword_seen = true;
      } else if (keyword_seen) {
        return Error(Peek(), "a positional argument follows a keyword argument");
      }
      ASSIGN_OR_RETURN(arg.value, ParseExpression());
      args->push_back(std::move(arg));
    }
    Next();
    return absl::OkStatus();
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;  // statements and expressions being parsed, one inside the other
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  return Parser(std::move(tokens)).ParseAll();
}

}  // namespace strata::chat::jinja
