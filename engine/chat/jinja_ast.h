#ifndef STRATA_ENGINE_CHAT_JINJA_AST_H_
#define STRATA_ENGINE_CHAT_JINJA_AST_H_

// The parsed form of a Jinja template: statements (text, output, if, for, set, macro, ...) over
// expressions. Built by ParseTemplate (jinja_parser.h), read by the interpreter; immutable once built.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat/jinja_value.h"

namespace strata::chat::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // children: the items (lists and tuples alike)
    kDict,     // children: key, value, key, value, ...
    kAttr,     // children[0].name
    kItem,     // children[0][children[1]]
    kSlice,    // children[0][children[1]:children[2]:children[3]], any of the last three may be null
    kCall,     // children[0](args)
    kFilter,   // children[0] | name(args)
    kTest,     // children[0] is [not] name(args); negated
    kNeg,      // -children[0]
    kPos,      // +children[0]
    kNot,      // not children[0]
    kAnd,      // children[0] and children[1]
    kOr,       // children[0] or children[1]
    kBinary,   // children[0] op children[1]; op one of + - * / // % ** ~
    kCompare,  // children[0] ops[0] children[1] ops[1] ...; ops: == != < > <= >= in notin
    kCond,     // children[0] if children[1] else children[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;  // kName, kAttr, kFilter, kTest; the operator of kBinary
  std::vector<ExprPtr> children;
  std::vector<std::string> ops;  // kCompare
  std::vector<Arg> args;         // kCall, kFilter, kTest
  bool negated = false;          // kTest
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (condition, body) in order; else_body
    kFor,       // for targets in expr [if filter]: body [else: else_body]
    kSet,       // set targets = expr, or set targets[0].attribute = expr
    kSetBlock,  // set targets[0]: body (what it renders)
    kMacro,     // macro name(params): body
    kBreak,
    kContinue,
    kBlock,     // a block that only renders its body ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> targets;
  std::string attribute;  // kSet on a namespace attribute
  ExprPtr filter;         // kFor
  std::string name;       // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name and default (null: none)
};

}  // namespace strata::chat::jinja

#endif  // STRATA_ENGINE_CHAT_JINJA_AST_H_
