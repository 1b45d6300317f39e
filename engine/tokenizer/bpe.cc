#include "engine/tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace strata::tokenizer {
namespace {

// A symbol of the word being merged: a byte range, linked to its live neighbours.
struct Symbol {
  uint32_t begin;
  uint32_t length;  // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  uint32_t length;  // of left + right when queued; a mismatch later means the pair is stale
};

// Lowest rank on top, then the leftmost.
struct BigramAfter {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(const std::vector<std::string>& merges,
                                                           const TokenIndex* index, int32_t unk_id,
                                                           const PreTokenizerSpec& pre) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->index_ = index;
  model->unk_id_ = unk_id;
  model->ignore_merges_ = pre.ignore_merges;
  absl::StatusOr<std::unique_ptr<PreTokenizer>> pre_tokenizer = PreTokenizer::Create(pre.patterns);
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  model->pre_tokenizer_ = *std::move(pre_tokenizer);

  model->ranks_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& merge = merges[i];
    // The separator is the first space after the first byte, so a left part may itself be a space.
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= merge.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.merges[", i, "] = '",
                                                     merge, "' is not two symbols separated by a space"));
    }
    model->ranks_.try_emplace(std::make_pair(merge.substr(0, space), merge.substr(space + 1)),
                              static_cast<int32_t>(i));
  }
  return model;
}

int32_t BpeModel::Rank(std::string_view left, std::string_view right) const {
  const auto it = ranks_.find(TextPair(left, right));
  return it == ranks_.end() ? -1 : it->second;
}

int32_t BpeModel::Find(std::string_view text) const {
  const auto it = index_->find(text);
  return it == index_->end() ? -1 : it->second;
}

void BpeModel::Encode(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = RepairUtf8(text);
    text = repaired;
  }
  std::vector<std::string_view> words;
  pre_tokenizer_->Split(text, &words);
  std::string encoded;
  for (std::string_view word : words) {
    encoded.clear();
    ByteLevelEncode(word, &encoded);
    EncodeWord(encoded, out);
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    const int32_t id = Find(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }

  // `word` is valid UTF-8 (the byte alphabet), so its characters are its symbols.
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (uint32_t pos = 0; pos < word.size();) {
    const uint32_t length = std::min<uint32_t>(Utf8SequenceLength(static_cast<uint8_t>(word[pos])),
                                               static_cast<uint32_t>(word.size()) - pos);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({pos, length, index - 1, pos + length < word.size() ? index + 1 : -1});
    pos += length;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramAfter> queue;
  const auto text_of = [&](const Symbol& s) { return word.substr(s.begin, s.length); };
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t rank = Rank(text_of(symbols[left]), text_of(symbols[right]));
    if (rank < 0) return;
    queue.push({rank, left, right, symbols[left].length + symbols[right].length});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Symbols only ever grow, so an unchanged adjacent pair of the queued total length is the same pair.
    if (left.length == 0 || right.length == 0 || left.next != bigram.right ||
        left.length + right.length != bigram.length) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = text_of(symbols[i]);
    const int32_t id = Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    // Not a token: fall back to its characters (every byte character is a token in a sound vocabulary).
    for (size_t pos = 0; pos < piece.size();) {
      const size_t length = std::min(Utf8SequenceLength(static_cast<uint8_t>(piece[pos])), piece.size() - pos);
      const int32_t char_id = Find(piece.substr(pos, length));
      if (char_id >= 0) {
        out->push_back(char_id);
      } else if (unk_id_ >= 0) {
        out->push_back(unk_id_);
      }
      pos += length;
    }
  }
}

}  // namespace strata::tokenizer
