#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "engine/log.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/spm.h"
#include "engine/tokenizer/utf8.h"

namespace strata::tokenizer {
namespace {

// Texts llama.cpp treats as end of generation whatever their type (and then forces to control).
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",  // DeepSeek's <｜end▁of▁sentence｜>
    "[e~[",
};

// Texts that name the end-of-turn token when tokenizer.ggml.eot_token_id is absent.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
    "<end_of_utterance>",
};

// Fill-in-the-middle tokens that end generation (llama.cpp's FIM pad / repo / file separator).
constexpr std::string_view kFimEogTexts[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<reponame>",
    "<|file_sep|>",
};

// "<0x41>" -> 0x41; -1 when `text` is not of that form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerVocab vocab) {
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  RETURN_IF_ERROR(tokenizer->Init(std::move(vocab)));
  return tokenizer;
}

Tokenizer::~Tokenizer() = default;

uint8_t Tokenizer::AttrForType(TokenType type) {
  switch (type) {
    case TokenType::kNormal: return kAttrNormal;
    case TokenType::kUnknown: return kAttrUnknown;
    case TokenType::kControl: return kAttrControl;
    case TokenType::kUserDefined: return kAttrUserDefined;
    case TokenType::kUnused: return kAttrUnused;
    case TokenType::kByte: return kAttrByte;
    case TokenType::kUndefined: break;
  }
  return 0;
}

absl::Status Tokenizer::Init(TokenizerVocab vocab) {
  if (vocab.model == "gpt2") {
    model_ = Model::kBpe;
  } else if (vocab.model == "llama") {
    model_ = Model::kSpm;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.model = '", vocab.model,
                                                   "' is not supported (expected 'gpt2' or 'llama')"));
  }
  const size_t n = vocab.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer metadata: tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.tokens has ", n,
                                                   " entries, more than token ids can address"));
  }
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.scores has ",
                                                   vocab.scores.size(), " entries, expected ", n,
                                                   " (one per token)"));
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.token_type has ",
                                                   vocab.token_types.size(), " entries, expected ", n,
                                                   " (one per token)"));
  }

  tokens_ = std::move(vocab.tokens);
  scores_ = std::move(vocab.scores);
  if (scores_.empty()) scores_.assign(n, 0.0f);
  attrs_.assign(n, kAttrNormal);
  index_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(scores_[i])) {
      // Merge priorities compare scores; a NaN would leave their order undefined.
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer metadata: tokenizer.ggml.scores[", i, "] is NaN, expected a number"));
    }
    if (!vocab.token_types.empty()) {
      const int32_t type = vocab.token_types[i];
      if (type < 0 || type > static_cast<int32_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.token_type[", i,
                                                       "] = ", type, " is not a token type (0..6)"));
      }
      attrs_[i] = AttrForType(static_cast<TokenType>(type));
    }
    if (tokens_[i].empty()) {  // as llama.cpp: keep the id usable under a placeholder name
      spdlog::warn("tokenizer: token {} is empty; naming it [EMPTY_{}]", i, i);
      tokens_[i] = absl::StrCat("[EMPTY_", i, "]");
    }
    const auto [it, inserted] = index_.try_emplace(std::string_view(tokens_[i]), static_cast<int32_t>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.tokens has '",
                                                     tokens_[i], "' twice (ids ", it->second, " and ", i, ")"));
    }
  }

  PreTokenizerSpec pre_spec;
  if (model_ == Model::kBpe) {
    ASSIGN_OR_RETURN(pre_spec, LookupPreTokenizer(vocab.pre));
    if (vocab.pre.empty()) {
      spdlog::warn("tokenizer: tokenizer.ggml.pre is absent; using llama.cpp's default pre-tokenizer");
    }
    pre_ = pre_spec.name;
  }

  // Model defaults, then the metadata.
  add_bos_ = model_ == Model::kSpm || pre_spec.add_bos;
  add_eos_ = false;
  add_space_prefix_ = model_ == Model::kSpm;
  RETURN_IF_ERROR(InitSpecialIds(vocab));
  add_bos_ = vocab.add_bos.value_or(add_bos_);
  add_eos_ = vocab.add_eos.value_or(add_eos_);
  add_space_prefix_ = vocab.add_space_prefix.value_or(add_space_prefix_);
  if (add_bos_ && bos_ < 0) {
    return absl::InvalidArgumentError(
        "tokenizer metadata: tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is not set");
  }
  if (add_eos_ && eos_ < 0) {
    return absl::InvalidArgumentError(
        "tokenizer metadata: tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is not set");
  }

  InitEog();
  for (int32_t id = 0; id < n_vocab(); ++id) {
    if (attrs_[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) specials_.push_back(id);
  }
  std::stable_sort(specials_.begin(), specials_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  InitPieces();

  if (model_ == Model::kBpe) {
    ASSIGN_OR_RETURN(bpe_, BpeModel::Create(vocab.merges, &index_, unk_, pre_spec));
  } else {
    std::array<int32_t, 256> byte_tokens;
    for (int b = 0; b < 256; ++b) {
      int32_t id = TokenId(absl::StrFormat("<0x%02X>", b));
      if (id < 0) id = TokenId(std::string(1, static_cast<char>(b)));
      byte_tokens[b] = id;
    }
    spm_ = std::make_unique<SpmModel>(&index_, &scores_, byte_tokens, unk_);
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::InitSpecialIds(const TokenizerVocab& vocab) {
  const int64_t n = n_vocab();
  // llama.cpp's SentencePiece defaults; BPE vocabularies have none unless the metadata names them.
  const bool spm = model_ == Model::kSpm;
  struct Slot {
    const char* key;
    const std::optional<int64_t>& value;
    int64_t fallback;
    bool required;  // an out-of-range id is an error (else a warning, as llama.cpp treats it)
    int32_t* out;
  };
  // End-of-generation tokens beyond eos/eot: eom and the fill-in-the-middle markers, as llama.cpp marks them.
  int32_t eom = -1, sep = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  const Slot slots[] = {
      {"tokenizer.ggml.bos_token_id", vocab.bos_id, spm ? 1 : -1, true, &bos_},
      {"tokenizer.ggml.eos_token_id", vocab.eos_id, spm ? 2 : -1, true, &eos_},
      {"tokenizer.ggml.eot_token_id", vocab.eot_id, -1, true, &eot_},
      {"tokenizer.ggml.eom_token_id", vocab.eom_id, -1, true, &eom},
      {"tokenizer.ggml.unknown_token_id", vocab.unk_id, spm ? 0 : -1, false, &unk_},
      {"tokenizer.ggml.padding_token_id", vocab.pad_id, -1, false, &pad_},
      {"tokenizer.ggml.seperator_token_id", vocab.sep_id, -1, false, &sep},
      {"tokenizer.ggml.fim_pad_token_id", vocab.fim_pad_id, -1, false, &fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", vocab.fim_rep_id, -1, false, &fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", vocab.fim_sep_id, -1, false, &fim_sep},
  };
  for (const Slot& slot : slots) {
    const int64_t fallback = slot.fallback < n ? slot.fallback : -1;
    if (!slot.value.has_value() || *slot.value < 0) {
      *slot.out = static_cast<int32_t>(fallback);
      continue;
    }
    if (*slot.value < n) {
      *slot.out = static_cast<int32_t>(*slot.value);
      continue;
    }
    const std::string message = absl::StrCat(slot.key, " = ", *slot.value, " is outside the vocabulary (",
                                              n, " tokens)");
    if (slot.required) return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: ", message));
    spdlog::warn("tokenizer: {}; ignoring it", message);
    *slot.out = static_cast<int32_t>(fallback);
  }
  for (int32_t id : {eom, fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) attrs_[id] |= kAttrEog;
  }
  return absl::OkStatus();
}

void Tokenizer::InitEog() {
  const auto mark = [&](int32_t id) {
    if (id >= 0 && id < n_vocab()) attrs_[id] |= kAttrEog;
  };
  const auto mark_text = [&](std::string_view text) {
    const int32_t id = TokenId(text);
    if (id >= 0) attrs_[id] |= kAttrEog | kAttrControl;
  };
  if (eot_ < 0) {
    for (std::string_view text : kEotTexts) {
      const int32_t id = TokenId(text);
      if (id >= 0 && (eot_ < 0 || id < eot_)) eot_ = id;
    }
  }
  for (std::string_view text : kEogTexts) mark_text(text);
  for (std::string_view text : kFimEogTexts) mark_text(text);
  mark(eos_);
  mark(eot_);

  // gpt-oss (and solar-open) end a message with <|end|> but a turn with <|return|> / <|call|>: there
  // <|end|> is an ordinary rendered token, as llama.cpp decides.
  const auto is_eog = [&](std::string_view text) {
    const int32_t id = TokenId(text);
    return id >= 0 && (attrs_[id] & kAttrEog);
  };
  const int32_t end_id = TokenId("<|end|>");
  if (end_id >= 0 && (attrs_[end_id] & kAttrEog) && end_id != eos_ &&
      ((is_eog("<|return|>") && is_eog("<|call|>")) || (is_eog("<|calls|>") && is_eog("<|flush|>")))) {
    attrs_[end_id] = kAttrUserDefined;
    if (eot_ == end_id) eot_ = -1;
  }

  for (int32_t id = 0; id < n_vocab(); ++id) {
    if (attrs_[id] & kAttrEog) eog_ids_.push_back(id);
  }
}

void Tokenizer::InitPieces() {
  piece_offsets_.reserve(tokens_.size() + 1);
  piece_offsets_.push_back(0);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& text = tokens_[id];
    const uint8_t attr = attrs_[id];
    if (attr & (kAttrControl | kAttrUnknown | kAttrUserDefined)) {
      piece_blob_.append(text);
    } else if (attr & kAttrNormal) {
      if (model_ == Model::kSpm) {
        piece_blob_.append(absl::StrReplaceAll(text, {{"\xE2\x96\x81", " "}}));
      } else {
        const size_t size = piece_blob_.size();
        if (!ByteLevelDecode(text, &piece_blob_)) {
          piece_blob_.resize(size);
          piece_blob_.append(text);  // outside the byte alphabet: a malformed entry, shown as written
        }
      }
    } else if (attr & kAttrByte) {
      const int byte = ParseByteToken(text);
      if (byte >= 0) {
        piece_blob_.push_back(static_cast<char>(byte));
      } else {
        piece_blob_.append(text);
      }
    }
    // Unused and undefined tokens stay empty, as in llama.cpp.
    piece_offsets_.push_back(piece_blob_.size());
  }
}

std::string_view Tokenizer::TokenPiece(int32_t id, bool render_special) const {
  if (!IsValid(id)) return {};
  if (!render_special && (attrs_[id] & (kAttrControl | kAttrUnknown))) return {};
  return std::string_view(piece_blob_).substr(piece_offsets_[id], piece_offsets_[id + 1] - piece_offsets_[id]);
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  return IsValid(id) ? std::string_view(tokens_[id]) : std::string_view();
}

int32_t Tokenizer::TokenId(std::string_view text) const {
  const auto it = index_.find(text);
  return it == index_.end() ? -1 : it->second;
}

void Tokenizer::Partition(std::string_view text, bool parse_special, std::vector<Fragment>* fragments) const {
  std::vector<Fragment> next;
  for (const int32_t id : specials_) {
    if (!parse_special && (attrs_[id] & (kAttrControl | kAttrUnknown))) continue;
    const std::string_view special = tokens_[id];
    next.clear();
    bool found = false;
    for (const Fragment& fragment : *fragments) {
      if (fragment.token >= 0) {
        next.push_back(fragment);
        continue;
      }
      size_t pos = fragment.begin;
      const size_t end = fragment.begin + fragment.length;
      while (pos < end) {
        const size_t match = text.substr(0, end).find(special, pos);
        if (match == std::string_view::npos) break;
        if (match > pos) next.push_back({-1, pos, match - pos});
        next.push_back({id, 0, 0});
        pos = match + special.size();
        found = true;
      }
      if (pos < end) next.push_back({-1, pos, end - pos});
    }
    if (found) std::swap(*fragments, next);
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> out;
  if (options.add_special && add_bos_) out.push_back(bos_);
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({-1, 0, text.size()});
  Partition(text, options.parse_special, &fragments);

  bool after_special = true;  // SentencePiece prefixes a space to text at the start or after a special token
  std::string spm_text;
  for (const Fragment& fragment : fragments) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      after_special = true;
      continue;
    }
    const std::string_view piece = text.substr(fragment.begin, fragment.length);
    if (model_ == Model::kSpm) {
      spm_text.clear();
      if (add_space_prefix_ && after_special) spm_text.push_back(' ');
      spm_text.append(piece);
      spm_->Encode(spm_text, &out);
    } else {
      bpe_->Encode(piece, &out);
    }
    after_special = false;
  }
  if (options.add_special && add_eos_) out.push_back(eos_);
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string_view piece = TokenPiece(ids[i], options.render_special);
    if (i == 0 && options.strip_leading_space && add_space_prefix_ && !piece.empty() && piece[0] == ' ') {
      piece.remove_prefix(1);
    }
    out.append(piece);
  }
  return out;
}

}  // namespace strata::tokenizer
