#include "services/request_log.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::services {
namespace {

std::string Value(std::string_view value) {
  if (value.empty()) return "-";
  bool quote = false;
  for (unsigned char c : value) quote |= c <= ' ' || c == '"' || c == '=' || c == 0x7f;
  if (!quote) return std::string(value);
  std::string out = "\"";
  for (unsigned char c : value) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < ' ' || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string Seconds(double seconds) { return seconds < 0 ? "-" : absl::StrFormat("%.3f", seconds); }

}  // namespace

std::string FormatRequestLog(const RequestLogRecord& r) {
  std::string line = absl::StrCat(
      "request id=", Value(r.id), " method=", Value(r.method), " peer=", Value(r.peer),
      " prompt_tokens=", r.prompt_tokens, " completion_tokens=", r.completion_tokens,
      " ttft_s=", Seconds(r.ttft_seconds), " total_s=", Seconds(r.total_seconds), " finish=", Value(r.finish),
      " status=", absl::StatusCodeToString(r.status.code()));
  if (!r.status.ok()) absl::StrAppend(&line, " message=", Value(std::string(r.status.message())));
  return line;
}

}  // namespace strata::services
