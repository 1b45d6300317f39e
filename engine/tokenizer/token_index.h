#ifndef STRATA_ENGINE_TOKENIZER_TOKEN_INDEX_H_
#define STRATA_ENGINE_TOKENIZER_TOKEN_INDEX_H_

// A hash map from token text to id, keyed by std::string_view (Debian's Abseil has its own string_view,
// which absl::Hash does not take for std::string_view).

#include <cstdint>
#include <string_view>

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

// Token text -> id. The keys view the tokenizer's token list, which must outlive the index.
using TokenIndex = absl::flat_hash_map<std::string_view, int32_t, TextHash, TextEq>;

}  // namespace strata::tokenizer

#endif  // STRATA_ENGINE_TOKENIZER_TOKEN_INDEX_H_
