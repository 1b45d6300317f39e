#include "engine/runtime/stop_matcher.h"

#include <algorithm>

namespace strata::runtime {

StopMatcher::StopMatcher(const std::vector<std::string>& stop_strings) {
  for (const std::string& s : stop_strings) {
    if (s.empty()) continue;
    Pattern p;
    p.text = s;
    p.failure.assign(s.size(), 0);
    uint32_t k = 0;
    for (size_t i = 1; i < s.size(); ++i) {
      while (k > 0 && s[i] != s[k]) k = p.failure[k - 1];
      if (s[i] == s[k]) ++k;
      p.failure[i] = k;
    }
    patterns_.push_back(std::move(p));
  }
}

StopResult StopMatcher::Push(std::string_view piece) {
  StopResult result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  if (patterns_.empty()) {
    result.emit.assign(piece);
    return result;
  }
  const size_t held_before = held_.size();
  held_.append(piece);
  for (size_t i = held_before; i < held_.size(); ++i) {
    const char c = held_[i];
    const Pattern* match = nullptr;
    for (Pattern& p : patterns_) {
      while (p.state > 0 && p.text[p.state] != c) p.state = p.failure[p.state - 1];
      if (p.text[p.state] == c) ++p.state;
      if (p.state == p.text.size() && (match == nullptr || p.text.size() > match->text.size())) {
        match = &p;
      }
    }
    if (match != nullptr) {
      // The match lies within held_: its start was a live prefix, and held_ keeps the longest of those.
      const size_t start = i + 1 - match->text.size();
      result.emit = held_.substr(0, start);
      result.stopped = true;
      stopped_ = true;
      matched_ = match->text;
      held_.clear();
      return result;
    }
  }
  uint32_t live = 0;
  for (const Pattern& p : patterns_) live = std::max(live, p.state);
  const size_t release = held_.size() - std::min<size_t>(live, held_.size());
  result.emit = held_.substr(0, release);
  held_.erase(0, release);
  return result;
}

std::string StopMatcher::Flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  for (Pattern& p : patterns_) p.state = 0;
  return out;
}

}  // namespace strata::runtime
