#include "engine/tokenizer/spm.h"

#include <queue>
#include <string>

#include "engine/tokenizer/utf8.h"

namespace strata::tokenizer {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581

struct Symbol {
  uint32_t begin;
  uint32_t length;  // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t length;
};

// Highest score on top, then the leftmost.
struct BigramBelow {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

int32_t SpmModel::Find(std::string_view text) const {
  const auto it = index_->find(text);
  return it == index_->end() ? -1 : it->second;
}

void SpmModel::Encode(std::string_view raw, std::vector<int32_t>* out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 2);
  for (char c : raw) {
    if (c == ' ') {
      text.append(kSpaceMarker);
    } else {
      text.push_back(c);
    }
  }
  if (text.empty()) return;

  // One symbol per character. A byte that is not part of a valid character is a symbol of its own and
  // ends up as <0xXX> (llama.cpp trusts the lead byte instead, which lets a truncated sequence swallow the
  // next character; on valid UTF-8 the two agree).
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (uint32_t pos = 0; pos < text.size();) {
    const Utf8Scan scan = ScanUtf8(text, pos);
    const uint32_t length = scan.kind == Utf8Scan::kValid ? static_cast<uint32_t>(scan.length) : 1;
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({pos, length, index - 1, pos + length < text.size() ? index + 1 : -1});
    pos += length;
  }

  const std::string_view view = text;
  const auto text_of = [&](const Symbol& s) { return view.substr(s.begin, s.length); };
  std::priority_queue<Bigram, std::vector<Bigram>, BigramBelow> queue;
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const int32_t id = Find(view.substr(l.begin, l.length + r.length));
    if (id < 0) return;
    queue.push({(*scores_)[id], left, right, l.length + r.length});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
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

  // Every merged symbol is a token by construction; single characters may not be.
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = text_of(symbols[i]);
    const int32_t id = Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t byte_id = byte_tokens_[static_cast<uint8_t>(c)];
      if (byte_id >= 0) {
        out->push_back(byte_id);
      } else if (unk_id_ >= 0) {
        out->push_back(unk_id_);
      }
    }
  }
}

}  // namespace strata::tokenizer
