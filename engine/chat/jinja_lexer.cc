#include "engine/chat/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_value.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/utf8.h"

namespace strata::chat::jinja {
namespace {

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// True when `s` is non-empty and all Python whitespace.
bool AllWhitespace(std::string_view s) { return !s.empty() && StripPython(s, true, false).empty(); }

absl::Status LexError(int line, std::string_view what) {
  return absl::InvalidArgumentError(Cat("line ", line, ": ", what));
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes a string literal's body as Python's "unicode-escape" codec does.
std::string DecodeEscapes(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char c = body[++i];
    switch (c) {
      case '\n':
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(c);
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        size_t n = 0;
        while (n < digits && i + 1 + n < body.size() && HexValue(body[i + 1 + n]) >= 0) {
          cp = cp * 16 + static_cast<uint32_t>(HexValue(body[i + 1 + n]));
          ++n;
        }
        if (n != digits || cp > 0x10FFFF) {
          out.push_back('\\');
          out.push_back(c);
          break;
        }
        tokenizer::AppendUtf8(cp, &out);
        i += n;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          tokenizer::AppendUtf8(cp, &out);
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t tag = src_.find('{', pos);
      while (tag != std::string::npos && tag + 1 < src_.size() && src_[tag + 1] != '{' && src_[tag + 1] != '%' &&
             src_[tag + 1] != '#') {
        tag = src_.find('{', tag + 1);
      }
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        AddText(src_.substr(pos));
        break;
      }
      const char type = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      std::string_view text = std::string_view(src_).substr(pos, tag - pos);
      if (sign == '-') {
        text = StripPython(text, false, true);
      } else if (sign != '+' && type != '{') {
        const size_t line_start = text.rfind('\n') == std::string_view::npos ? 0 : text.rfind('\n') + 1;
        if ((line_start > 0 || line_starting) && AllWhitespace(text.substr(line_start))) {
          text = text.substr(0, line_start);
        }
      }
      AddText(text);
      size_t p = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      const int line = LineAt(tag);
      size_t end;
      if (type == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string::npos) return LexError(line, "unterminated comment: no '#}'");
        end = close + 2;
        if (close > p && src_[close - 1] == '-') {
          while (end < src_.size() && IsPythonSpaceAt(end)) end = NextCodePoint(end);
        } else if (!(close > p && src_[close - 1] == '+') && end < src_.size() && src_[end] == '\n') {
          ++end;
        }
      } else {
        tokens_.push_back({type == '{' ? Token::Kind::kVarBegin : Token::Kind::kBlockBegin, "", line});
        ASSIGN_OR_RETURN(end, LexTag(p, type == '{', line));
      }
      line_starting = end > 0 && src_[end - 1] == '\n';
      pos = end;
    }
    tokens_.push_back({Token::Kind::kEof, "", LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin());
  }

  size_t NextCodePoint(size_t pos) const {
    const tokenizer::Utf8Scan scan = tokenizer::ScanUtf8(src_, pos);
    return pos + (scan.kind == tokenizer::Utf8Scan::kValid ? scan.length : 1);
  }
  bool IsPythonSpaceAt(size_t pos) const {
    const tokenizer::Utf8Scan scan = tokenizer::ScanUtf8(src_, pos);
    return scan.kind == tokenizer::Utf8Scan::kValid && IsPythonSpace(scan.code_point);
  }

  void AddText(std::string_view text) {
    if (!text.empty()) tokens_.push_back({Token::Kind::kText, std::string(text), 0});
  }

  // Lexes the inside of a {{ }} or {% %} tag from `pos`; returns the position after its end (and after
  // what the end's whitespace rules consume).
  absl::StatusOr<size_t> LexTag(size_t pos, bool variable, int line) {
    const std::string_view close = variable ? "}}" : "%}";
    std::vector<char> brackets;
    while (true) {
      while (pos < src_.size() && IsAsciiSpace(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        return LexError(line, Cat("unterminated tag: no '", close, "'"));
      }
      const int token_line = LineAt(pos);
      std::string_view rest = std::string_view(src_).substr(pos);
      if (brackets.empty()) {
        size_t end = std::string::npos;
        if (rest.substr(0, 1) == "-" && rest.substr(1, 2) == close) {
          end = pos + 3;
          while (end < src_.size() && IsPythonSpaceAt(end)) end = NextCodePoint(end);
        } else if (!variable && rest.substr(0, 3) == "+%}") {
          end = pos + 3;
        } else if (rest.substr(0, 2) == close) {
          end = pos + 2;
          if (!variable && end < src_.size() && src_[end] == '\n') ++end;
        }
        if (end != std::string::npos) {
          tokens_.push_back({variable ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", token_line});
          return end;
        }
      }
      const char c = src_[pos];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        bool is_float = false;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t x = e + 1;
          if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
          if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
            is_float = true;
            e = x;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string digits;
        for (size_t i = pos; i < e; ++i) {
          if (src_[i] != '_') digits.push_back(src_[i]);
        }
        tokens_.push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInt, digits, token_line});
        pos = e;
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        tokens_.push_back({Token::Kind::kName, src_.substr(pos, e - pos), token_line});
        pos = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = pos + 1;
        while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= src_.size()) return LexError(token_line, "unterminated string literal");
        tokens_.push_back({Token::Kind::kString, DecodeEscapes(std::string_view(src_).substr(pos + 1, e - pos - 1)),
                           token_line});
        pos = e + 1;
        continue;
      }
      static constexpr std::string_view kTwoCharOps[] = {"//", "**", "==", "!=", "<=", ">="};
      std::string op;
      for (std::string_view two : kTwoCharOps) {
        if (rest.substr(0, 2) == two) op = std::string(two);
      }
      if (op.empty() && std::string_view("+-/*%~[](){}<>=.:|,;").find(c) != std::string_view::npos) op = c;
      if (op.empty()) return LexError(token_line, Cat("unexpected character '", std::string(1, c), "'"));
      if (op == "(" || op == "[" || op == "{") brackets.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      if (op == ")" || op == "]" || op == "}") {
        if (brackets.empty() || brackets.back() != op[0]) return LexError(token_line, Cat("unexpected '", op, "'"));
        brackets.pop_back();
      }
      tokens_.push_back({Token::Kind::kOp, op, token_line});
      pos += op.size();
    }
  }

  std::string src_;
  std::vector<size_t> newlines_;  // offsets of the '\n's of src_
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(std::string_view source) {
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(source[i]);
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized)).Run();
}

}  // namespace strata::chat::jinja
