#include "engine/tokenizer/streaming_decoder.h"

#include <string_view>

#include "engine/tokenizer/utf8.h"

namespace strata::tokenizer {

std::string StreamingDecoder::Add(int32_t id) {
  std::string_view piece = tokenizer_->TokenPiece(id, options_.render_special);
  if (first_ && options_.strip_leading_space && tokenizer_->add_space_prefix() && !piece.empty() &&
      piece[0] == ' ') {
    piece.remove_prefix(1);
  }
  first_ = false;
  if (piece.empty()) return {};

  held_.append(piece);
  std::string out;
  out.reserve(held_.size());
  size_t pos = 0;
  while (pos < held_.size()) {
    const Utf8Scan scan = ScanUtf8(held_, pos);
    if (scan.kind == Utf8Scan::kIncomplete) break;  // may still be completed by the next token
    if (scan.kind == Utf8Scan::kValid) {
      out.append(held_, pos, scan.length);
    } else {
      out.append(kReplacementChar);
    }
    pos += scan.length;
  }
  held_.erase(0, pos);
  return out;
}

std::string StreamingDecoder::Flush() {
  // What is held is a valid prefix, so it is exactly one incomplete sequence.
  std::string out = held_.empty() ? std::string() : std::string(kReplacementChar);
  held_.clear();
  first_ = true;
  return out;
}

}  // namespace strata::tokenizer
