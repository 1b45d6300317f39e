#ifndef STRATA_ENGINE_TOKENIZER_TOKEN_INDEX_H_
#define STRATA_ENGINE_TOKENIZER_TOKEN_INDEX_H_

// Hash maps keyed by token text that are looked up with std::string_view (Debian's Abseil has its own
// string_view, so the maps' default transparent lookup does not take std::string_view).

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace strata::tokenizer {

inline absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

struct TextHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return absl::Hash<absl::string_view>()(AsAbsl(s)); }
};

struct TextEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

// Token text -> id.
using TokenIndex = absl::flat_hash_map<std::string, int32_t, TextHash, TextEq>;

using TextPair = std::pair<std::string_view, std::string_view>;

struct TextPairHash {
  using is_transparent = void;
  size_t operator()(const TextPair& p) const {
    return absl::Hash<std::pair<absl::string_view, absl::string_view>>()({AsAbsl(p.first), AsAbsl(p.second)});
  }
  size_t operator()(const std::pair<std::string, std::string>& p) const { return (*this)(TextPair(p.first, p.second)); }
};

struct TextPairEq {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return std::string_view(a.first) == std::string_view(b.first) &&
           std::string_view(a.second) == std::string_view(b.second);
  }
};

// (left, right) -> value.
template <typename V>
using TextPairMap = absl::flat_hash_map<std::pair<std::string, std::string>, V, TextPairHash, TextPairEq>;

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_TOKEN_INDEX_H_
