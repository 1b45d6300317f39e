#ifndef STRATA_TESTS_SERVICES_METRICS_TEST_UTIL_H_
#define STRATA_TESTS_SERVICES_METRICS_TEST_UTIL_H_

// Reads Prometheus' text exposition format back, strictly enough to catch a malformed page: every sample
// line is `name{label="value",...} number`, every family has one "# HELP" and one "# TYPE" before its
// samples, and histogram buckets are cumulative with +Inf equal to _count. Header-only: the test binary
// compiles *_test.cc files only.

#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace strata::services::testing {

struct ParsedMetrics {
  std::map<std::string, std::string> types;  // family -> counter, gauge, histogram
  std::map<std::string, double> samples;     // "name{labels as written}" -> value
  // The value of a sample, e.g. Value("strata_requests_total{api=\"http\",status=\"ok\"}"); nullopt when absent.
  std::optional<double> Value(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? std::nullopt : std::optional<double>(it->second);
  }
  double ValueOr0(const std::string& series) const { return Value(series).value_or(0); }
};

inline bool IsMetricName(const std::string& name) {
  if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_' || name[0] == ':'))
    return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':')) return false;
  }
  return true;
}

// The family a sample belongs to: its name less a histogram suffix, when that family is a histogram.
inline std::string FamilyOf(const std::string& name, const std::map<std::string, std::string>& types) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(name, suffix)) {
      const std::string base = name.substr(0, name.size() - std::string(suffix).size());
      auto it = types.find(base);
      if (it != types.end() && it->second == "histogram") return base;
    }
  }
  return name;
}

inline absl::StatusOr<ParsedMetrics> ParsePrometheusText(const std::string& text) {
  ParsedMetrics parsed;
  std::map<std::string, int> helps;
  int line_number = 0;
  for (absl::string_view line_view : absl::StrSplit(text, '\n')) {
    ++line_number;
    const std::string line(line_view);
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, " '", line, "': ", why));
    };
    if (line.empty()) continue;
    if (absl::StartsWith(line, "# HELP ")) {
      std::vector<std::string> parts = absl::StrSplit(line.substr(7), absl::MaxSplits(' ', 1));
      if (parts.size() != 2 || !IsMetricName(parts[0])) return bad("malformed HELP");
      if (++helps[parts[0]] != 1) return bad("second HELP for the family");
      continue;
    }
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line.substr(7), ' ');
      if (parts.size() != 2 || !IsMetricName(parts[0])) return bad("malformed TYPE");
      if (parts[1] != "counter" && parts[1] != "gauge" && parts[1] != "histogram") return bad("unknown type");
      if (!parsed.types.emplace(parts[0], parts[1]).second) return bad("second TYPE for the family");
      continue;
    }
    if (line[0] == '#') return bad("unknown comment");
    // name, optional {labels}, value
    size_t name_end = 0;
    while (name_end < line.size() && line[name_end] != '{' && line[name_end] != ' ') ++name_end;
    const std::string name = line.substr(0, name_end);
    if (!IsMetricName(name)) return bad("bad metric name");
    size_t value_start = name_end;
    if (name_end < line.size() && line[name_end] == '{') {
      size_t i = name_end + 1;
      bool in_quotes = false;
      for (; i < line.size(); ++i) {
        if (in_quotes && line[i] == '\\') {
          ++i;
        } else if (line[i] == '"') {
          in_quotes = !in_quotes;
        } else if (!in_quotes && line[i] == '}') {
          break;
        }
      }
      if (i >= line.size()) return bad("unterminated labels");
      value_start = i + 1;
    }
    if (value_start >= line.size() || line[value_start] != ' ') return bad("no space before the value");
    const std::string value_text = line.substr(value_start + 1);
    double value = 0;
    if (value_text == "+Inf") {
      value = INFINITY;
    } else {
      char* end = nullptr;
      value = std::strtod(value_text.c_str(), &end);
      if (end == value_text.c_str() || *end != '\0') return bad("value is not a number");
    }
    const std::string family = FamilyOf(name, parsed.types);
    if (parsed.types.count(family) == 0 || helps.count(family) == 0) return bad("sample before its HELP and TYPE");
    if (parsed.types[family] == "counter" && !absl::EndsWith(name, "_total")) return bad("counter not named _total");
    parsed.samples[line.substr(0, value_start)] = value;
  }
  // Histograms: per series (its labels less le), buckets cumulative in le order and +Inf == _count.
  for (const auto& [family, type] : parsed.types) {
    if (type != "histogram") continue;
    const std::string bucket_prefix = family + "_bucket";
    std::map<std::string, std::map<double, double>> buckets;  // labels less le ("" for none) -> le -> value
    for (const auto& [series, value] : parsed.samples) {
      if (!absl::StartsWith(series, bucket_prefix + "{")) continue;
      std::string labels = series.substr(bucket_prefix.size());
      const size_t le = labels.find("le=\"");
      if (le == std::string::npos) return absl::InvalidArgumentError(absl::StrCat(series, ": bucket without le"));
      const size_t le_end = labels.find('"', le + 4);
      const std::string bound = labels.substr(le + 4, le_end - le - 4);
      const size_t cut = (le > 1 && labels[le - 1] == ',') ? le - 1 : le;
      labels.erase(cut, le_end + 1 - cut);
      if (labels == "{}") labels.clear();
      buckets[labels][bound == "+Inf" ? INFINITY : std::strtod(bound.c_str(), nullptr)] = value;
    }
    for (const auto& [labels, by_bound] : buckets) {
      double previous = 0;
      for (const auto& [bound, value] : by_bound) {
        if (value < previous)
          return absl::InvalidArgumentError(absl::StrCat(family, labels, ": buckets not cumulative"));
        previous = value;
      }
      if (!std::isinf(by_bound.rbegin()->first)) {
        return absl::InvalidArgumentError(absl::StrCat(family, labels, ": no +Inf bucket"));
      }
      const std::optional<double> count = parsed.Value(family + "_count" + labels);
      if (!count.has_value() || *count != by_bound.rbegin()->second) {
        return absl::InvalidArgumentError(absl::StrCat(family, labels, ": +Inf bucket != _count"));
      }
      if (!parsed.Value(family + "_sum" + labels).has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(family, labels, ": no _sum"));
      }
    }
  }
  return parsed;
}

}  // namespace strata::services::testing

#endif  // STRATA_TESTS_SERVICES_METRICS_TEST_UTIL_H_
