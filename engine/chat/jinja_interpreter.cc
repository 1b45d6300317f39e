#include "engine/chat/jinja_interpreter.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_builtins.h"
#include "engine/status_macros.h"

namespace strata::chat::jinja {
namespace {

// Macro calls deeper than this fail (a template recursing without end).
constexpr int kMaxCallDepth = 64;
// Output beyond this fails (a template looping without end).
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
// Loop iterations and macro calls beyond this fail (nested loops that would run for hours).
constexpr int64_t kMaxSteps = 1'000'000;

enum class Flow { kNormal, kBreak, kContinue };

struct Scope {
  absl::flat_hash_map<std::string, Value> vars;
  const Scope* parent = nullptr;

  const Value* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      if (auto it = s->vars.find(name); it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

// Prefixes the template line to an evaluation error, once; the template's own raise_exception messages
// are passed on as they are.
absl::Status AtLine(const absl::Status& status, int line) {
  const absl::string_view message = status.message();
  if (absl::StartsWith(message, kRaisedPrefix) || absl::StartsWith(message, "line ")) return status;
  return absl::Status(status.code(), absl::StrCat("line ", line, ": ", message));
}

class Interpreter {
 public:
  Interpreter(const ValueDict& globals, const ValueDict& variables) {
    for (const auto& [k, v] : globals.items) root_.vars[k] = v;
    for (const auto& [k, v] : variables.items) root_.vars[k] = v;
  }

  absl::StatusOr<std::string> Run(const Body& body) {
    std::string out;
    RETURN_IF_ERROR(Exec(body, &root_, &out).status());
    return out;
  }

 private:
  absl::StatusOr<Flow> Exec(const Body& body, Scope* scope, std::string* out) {
    for (const std::unique_ptr<Stmt>& stmt : body) {
      absl::StatusOr<Flow> flow = ExecOne(*stmt, scope, out);
      if (!flow.ok()) return AtLine(flow.status(), stmt->line);
      if (*flow != Flow::kNormal) return flow;
      if (out->size() > kMaxOutputBytes) {
        return absl::ResourceExhaustedError(Cat("the output exceeds ", kMaxOutputBytes, " bytes"));
      }
    }
    return Flow::kNormal;
  }

  absl::Status Assign(const std::vector<std::string>& targets, const Value& value, Scope* scope) {
    if (targets.size() == 1) {
      scope->vars[targets[0]] = value;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
    if (items.size() != targets.size()) {
      return absl::InvalidArgumentError(
          Cat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = items[i];
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecOne(const Stmt& s, Scope* scope, std::string* out) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        *out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
        *out += v.ToString();
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          ASSIGN_OR_RETURN(Value c, Eval(*cond, scope));
          if (c.Truthy()) return Exec(body, scope, out);
        }
        return Exec(s.else_body, scope, out);
      case Stmt::Kind::kFor:
        return ExecFor(s, scope, out);
      case Stmt::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
        if (s.attribute.empty()) {
          RETURN_IF_ERROR(Assign(s.targets, v, scope));
          return Flow::kNormal;
        }
        const Value* ns = scope->Find(s.targets[0]);
        if (ns == nullptr || ns->kind() != Value::Kind::kNamespace) {
          return absl::InvalidArgumentError(
              Cat("cannot set '", s.targets[0], ".", s.attribute, "': '", s.targets[0],
                           "' is not a namespace()"));
        }
        ns->dict().Set(s.attribute, std::move(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        std::string text;
        RETURN_IF_ERROR(Exec(s.body, scope, &text).status());
        scope->vars[s.targets[0]] = Value::String(std::move(text));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->vars[s.name] = Value::Func(s.name, [this, &s](const CallArgs& args) { return CallMacro(s, args); });
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kBlock:
        return Exec(s.body, scope, out);
    }
    return Flow::kNormal;
  }

  absl::Status CountStep() {
    if (++steps_ > kMaxSteps) {
      return absl::ResourceExhaustedError(
          Cat("the template ran more than ", kMaxSteps, " loop iterations and macro calls"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& s, Scope* scope, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, scope));
    ASSIGN_OR_RETURN(std::vector<Value> all, Iterate(iterable));
    Scope loop_scope;
    loop_scope.parent = scope;
    std::vector<Value> items;
    for (const Value& item : all) {
      if (s.filter != nullptr) {
        RETURN_IF_ERROR(Assign(s.targets, item, &loop_scope));
        ASSIGN_OR_RETURN(Value keep, Eval(*s.filter, &loop_scope));
        if (!keep.Truthy()) continue;
      }
      items.push_back(item);
    }
    if (items.empty()) return Exec(s.else_body, scope, out);
    const int64_t n = static_cast<int64_t>(items.size());
    auto index = std::make_shared<int64_t>(0);  // the iteration loop.cycle answers for
    const Value cycle = Value::Func("loop.cycle", [index](const CallArgs& args) -> absl::StatusOr<Value> {
      if (args.positional.empty()) return absl::InvalidArgumentError("loop.cycle(): no items");
      return args.positional[static_cast<size_t>(*index) % args.positional.size()];
    });
    for (int64_t i = 0; i < n; ++i) {
      *index = i;
      RETURN_IF_ERROR(CountStep());
      RETURN_IF_ERROR(Assign(s.targets, items[static_cast<size_t>(i)], &loop_scope));
      ValueDict loop;
      loop.items.reserve(10);
      loop.items.emplace_back("index0", Value::Int(i));
      loop.items.emplace_back("index", Value::Int(i + 1));
      loop.items.emplace_back("revindex0", Value::Int(n - i - 1));
      loop.items.emplace_back("revindex", Value::Int(n - i));
      loop.items.emplace_back("first", Value::Bool(i == 0));
      loop.items.emplace_back("last", Value::Bool(i == n - 1));
      loop.items.emplace_back("length", Value::Int(n));
      if (i > 0) loop.items.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.items.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      loop.items.emplace_back("cycle", cycle);
      loop_scope.vars["loop"] = Value::Dict(std::move(loop));
      ASSIGN_OR_RETURN(Flow flow, Exec(s.body, &loop_scope, out));
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Value> CallMacro(const Stmt& macro, const CallArgs& args) {
    if (depth_ >= kMaxCallDepth) {
      return absl::ResourceExhaustedError(Cat("macro '", macro.name, "': calls nest deeper than ",
                                                       kMaxCallDepth));
    }
    RETURN_IF_ERROR(CountStep());
    if (args.positional.size() > macro.params.size()) {
      return absl::InvalidArgumentError(Cat("macro '", macro.name, "' takes ", macro.params.size(),
                                                     " arguments, ", args.positional.size(), " given"));
    }
    Scope scope;
    scope.parent = &root_;
    for (const auto& keyword : args.keyword) {
      const std::string& k = keyword.first;  // a named variable: clang 14 cannot capture structured bindings
      const bool known =
          std::any_of(macro.params.begin(), macro.params.end(), [&](const auto& p) { return p.first == k; });
      if (!known) {
        return absl::InvalidArgumentError(Cat("macro '", macro.name, "' has no argument '", k, "'"));
      }
    }
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const auto& [name, def] = macro.params[i];
      if (i < args.positional.size()) {
        scope.vars[name] = args.positional[i];
      } else if (const Value* kw = args.Keyword(name); kw != nullptr) {
        scope.vars[name] = *kw;
      } else if (def != nullptr) {
        ASSIGN_OR_RETURN(scope.vars[name], Eval(*def, &scope));
      } else {
        scope.vars[name] = Value::Undefined(Cat("'", name, "' is undefined"));
      }
    }
    ++depth_;
    std::string out;
    absl::StatusOr<Flow> flow = Exec(macro.body, &scope, &out);
    --depth_;
    RETURN_IF_ERROR(flow.status());
    return Value::String(std::move(out));
  }

  absl::StatusOr<CallArgs> EvalArgs(const std::vector<Arg>& args, Scope* scope) {
    CallArgs out;
    for (const Arg& a : args) {
      ASSIGN_OR_RETURN(Value v, Eval(*a.value, scope));
      if (a.name.empty()) {
        out.positional.push_back(std::move(v));
      } else {
        out.keyword.emplace_back(a.name, std::move(v));
      }
    }
    return out;
  }

  absl::StatusOr<Value> EvalOptional(const ExprPtr& e, Scope* scope) {
    if (e == nullptr) return Value();
    return Eval(*e, scope);
  }

  absl::StatusOr<Value> Eval(const Expr& e, Scope* scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        const Value* v = scope->Find(e.name);
        if (v == nullptr) return Value::Undefined(Cat("'", e.name, "' is undefined"));
        return *v;
      }
      case Expr::Kind::kList: {
        ValueList items;
        for (const ExprPtr& c : e.children) {
          ASSIGN_OR_RETURN(Value v, Eval(*c, scope));
          items.push_back(std::move(v));
        }
        return Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict dict;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.children[i], scope));
          if (!k.is_string()) return absl::InvalidArgumentError("dict keys must be strings");
          ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1], scope));
          dict.Set(k.str(), std::move(v));
        }
        return Value::Dict(std::move(dict));
      }
      case Expr::Kind::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        return GetAttribute(obj, e.name);
      }
      case Expr::Kind::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(Value key, Eval(*e.children[1], scope));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(Value start, EvalOptional(e.children[1], scope));
        ASSIGN_OR_RETURN(Value stop, EvalOptional(e.children[2], scope));
        ASSIGN_OR_RETURN(Value step, EvalOptional(e.children[3], scope));
        return GetSlice(obj, start, stop, step);
      }
      case Expr::Kind::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
        if (callee.kind() != Value::Kind::kFunction) {
          if (callee.is_undefined()) {
            return absl::InvalidArgumentError(Cat("cannot call an undefined value: ", callee.str()));
          }
          return absl::InvalidArgumentError(Cat("a ", callee.TypeName(), " is not callable"));
        }
        return callee.function()(args);
      }
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(Value input, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
        return ApplyFilter(e.name, input, args);
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value input, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args, scope));
        ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, input, args));
        return Value::Bool(result != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
        if (!v.is_number()) {
          return absl::InvalidArgumentError(Cat("bad operand type for unary minus or plus: ", v.TypeName()));
        }
        if (e.kind == Expr::Kind::kPos) return v.kind() == Value::Kind::kBool ? Value::Int(v.integer()) : v;
        return v.kind() == Value::Kind::kFloat ? Value::Float(-v.real()) : Value::Int(-v.integer());
      }
      case Expr::Kind::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], scope));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], scope));
        const bool short_circuit = e.kind == Expr::Kind::kAnd ? !left.Truthy() : left.Truthy();
        if (short_circuit) return left;
        return Eval(*e.children[1], scope);
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], scope));
        ASSIGN_OR_RETURN(Value right, Eval(*e.children[1], scope));
        return BinaryOp(e.name, left, right);
      }
      case Expr::Kind::kCompare:
        return EvalCompare(e, scope);
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value cond, Eval(*e.children[1], scope));
        if (cond.Truthy()) return Eval(*e.children[0], scope);
        if (e.children[2] == nullptr) return Value::Undefined("the condition of an 'x if c' without else was false");
        return Eval(*e.children[2], scope);
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> EvalCompare(const Expr& e, Scope* scope) {
    ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], scope));
    for (size_t i = 0; i < e.ops.size(); ++i) {
      ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1], scope));
      const std::string& op = e.ops[i];
      bool result;
      if (op == "==") {
        result = ValuesEqual(left, right);
      } else if (op == "!=") {
        result = !ValuesEqual(left, right);
      } else if (op == "in" || op == "notin") {
        ASSIGN_OR_RETURN(bool in, Contains(right, left));
        result = (op == "in") == in;
      } else if (op == "<") {
        ASSIGN_OR_RETURN(result, ValueLess(left, right));
      } else if (op == ">") {
        ASSIGN_OR_RETURN(result, ValueLess(right, left));
      } else if (op == "<=") {
        ASSIGN_OR_RETURN(bool greater, ValueLess(right, left));
        result = !greater;
      } else {
        ASSIGN_OR_RETURN(bool less, ValueLess(left, right));
        result = !less;
      }
      if (!result) return Value::Bool(false);
      left = std::move(right);
    }
    return Value::Bool(true);
  }

  Scope root_;
  int depth_ = 0;      // macro calls in progress
  int64_t steps_ = 0;  // loop iterations and macro calls so far
};

}  // namespace

absl::StatusOr<std::string> RenderTemplate(const Body& body, const ValueDict& globals, const ValueDict& variables) {
  Interpreter interpreter(globals, variables);
  return interpreter.Run(body);
}

}  // namespace strata::chat::jinja
