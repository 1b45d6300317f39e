#include "engine/tokenizer/bpe.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/log.h"
#include "engine/tokenizer/utf8.h"

namespace strata::tokenizer {
namespace {

// A symbol of the word being merged: a byte range of the word, linked to its live neighbours.
struct Symbol {
  int32_t id;       // its token (-1 only for a byte the vocabulary lacks)
  uint32_t begin;
  uint32_t length;  // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t result;
  uint32_t length;  // of left + right when queued; a mismatch later means the pair is stale
};

// Lowest rank on top, then the leftmost.
struct BigramAfter {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

struct BpeModel::Scratch {
  std::string encoded;
  std::vector<Symbol> symbols;
  std::vector<Bigram> queue;  // a heap ordered by BigramAfter
};

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

  std::string encoded;
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    encoded.clear();
    ByteLevelEncode(std::string_view(&byte, 1), &encoded);
    model->byte_ids_[b] = model->Find(encoded);
  }
  // Text is repaired to valid UTF-8 before encoding, so only bytes valid UTF-8 can hold matter.
  std::vector<std::string> missing;
  for (int b = 0; b < 256; ++b) {
    const bool in_utf8 = b != 0xC0 && b != 0xC1 && b < 0xF5;
    if (in_utf8 && model->byte_ids_[b] < 0) missing.push_back(absl::StrFormat("0x%02X", b));
  }
  if (!missing.empty()) {
    spdlog::warn("tokenizer: tokenizer.ggml.tokens has no token for byte{} {}; text holding {} is encoded as "
                 "{}",
                 missing.size() > 1 ? "s" : "", absl::StrJoin(missing, " "), missing.size() > 1 ? "them" : "it",
                 unk_id >= 0 ? "the unknown token" : "nothing (dropped)");
  }

  model->merges_.reserve(merges.size());
  std::string joined;
  size_t unusable = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& merge = merges[i];
    // The separator is the first space after the first byte, so a left part may itself be a space.
    const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= merge.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.merges[", i, "] = '",
                                                     merge, "' is not two symbols separated by a space"));
    }
    const std::string_view left = std::string_view(merge).substr(0, space);
    const std::string_view right = std::string_view(merge).substr(space + 1);
    joined.assign(left);
    joined.append(right);
    const int32_t left_id = model->Find(left);
    const int32_t right_id = model->Find(right);
    const int32_t result = model->Find(joined);
    if (left_id < 0 || right_id < 0 || result < 0) {
      ++unusable;
      continue;
    }
    model->merges_.try_emplace(PairKey(left_id, right_id), Merge{static_cast<int32_t>(i), result});
  }
  if (unusable > 0) {
    spdlog::warn("tokenizer: {} of {} merges name symbols outside the vocabulary; ignoring them", unusable,
                 merges.size());
  }
  return model;
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
  Scratch scratch;
  for (std::string_view word : words) EncodeWord(word, &scratch, out);
}

void BpeModel::EncodeWord(std::string_view word, Scratch* scratch, std::vector<int32_t>* out) const {
  if (ignore_merges_) {
    scratch->encoded.clear();
    ByteLevelEncode(word, &scratch->encoded);
    const int32_t id = Find(scratch->encoded);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }

  // One symbol per byte: each byte is one character of the byte alphabet.
  std::vector<Symbol>& symbols = scratch->symbols;
  const int32_t n = static_cast<int32_t>(word.size());
  symbols.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<uint8_t>(word[i])], static_cast<uint32_t>(i), 1, i - 1,
                  i + 1 < n ? i + 1 : -1};
  }

  std::vector<Bigram>& queue = scratch->queue;
  queue.clear();
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return;
    const auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    queue.push_back({it->second.rank, left, right, it->second.result, symbols[left].length + symbols[right].length});
    std::push_heap(queue.begin(), queue.end(), BigramAfter());
  };
  for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), BigramAfter());
    const Bigram bigram = queue.back();
    queue.pop_back();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Symbols only ever grow, so an unchanged adjacent pair of the queued total length is the same pair.
    if (left.length == 0 || right.length == 0 || left.next != bigram.right ||
        left.length + right.length != bigram.length) {
      continue;
    }
    left.id = bigram.result;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[i].next) {
    if (symbols[i].id >= 0) {
      out->push_back(symbols[i].id);
    } else if (unk_id_ >= 0) {
      out->push_back(unk_id_);
    }
  }
}

}  // namespace strata::tokenizer
