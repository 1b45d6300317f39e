#include "engine/tokenizer/vocab.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "engine/tokenizer/tokenizer.h"

namespace strata::tokenizer {
namespace {

absl::Status Annotate(const absl::Status& status) { return WithContext(status, "tokenizer metadata"); }

// Reads an optional key; absent keys leave `out` unset.
absl::Status ReadOptionalInt(const gguf::Metadata& metadata, std::string_view key, std::optional<int64_t>* out) {
  if (!metadata.Has(key)) return absl::OkStatus();
  absl::StatusOr<int64_t> value = metadata.GetInt(key);
  if (!value.ok()) return Annotate(value.status());
  *out = *value;
  return absl::OkStatus();
}

absl::Status ReadOptionalBool(const gguf::Metadata& metadata, std::string_view key, std::optional<bool>* out) {
  if (!metadata.Has(key)) return absl::OkStatus();
  absl::StatusOr<bool> value = metadata.GetBool(key);
  if (!value.ok()) return Annotate(value.status());
  *out = *value;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerVocab> VocabFromMetadata(const gguf::Metadata& metadata) {
  TokenizerVocab vocab;
  {
    absl::StatusOr<std::string> model = metadata.GetString("tokenizer.ggml.model");
    if (!model.ok()) return Annotate(model.status());
    vocab.model = *std::move(model);
  }
  if (metadata.Has("tokenizer.ggml.pre")) {
    absl::StatusOr<std::string> pre = metadata.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return Annotate(pre.status());
    vocab.pre = *std::move(pre);
  }
  {
    absl::StatusOr<std::vector<std::string>> tokens = metadata.GetStringArray("tokenizer.ggml.tokens");
    if (!tokens.ok()) return Annotate(tokens.status());
    vocab.tokens = *std::move(tokens);
  }
  if (metadata.Has("tokenizer.ggml.scores")) {
    absl::StatusOr<std::vector<float>> scores = metadata.GetFloatArray("tokenizer.ggml.scores");
    if (!scores.ok()) return Annotate(scores.status());
    vocab.scores = *std::move(scores);
  }
  if (metadata.Has("tokenizer.ggml.token_type")) {
    absl::StatusOr<std::vector<int64_t>> types = metadata.GetIntArray("tokenizer.ggml.token_type");
    if (!types.ok()) return Annotate(types.status());
    vocab.token_types.reserve(types->size());
    for (size_t i = 0; i < types->size(); ++i) {
      const int64_t type = (*types)[i];
      if (type < 0 || type > static_cast<int64_t>(TokenType::kByte)) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer metadata: tokenizer.ggml.token_type[", i,
                                                       "] = ", type, " is not a token type (0..6)"));
      }
      vocab.token_types.push_back(static_cast<int32_t>(type));
    }
  }
  if (vocab.model == "gpt2" && !metadata.Has("tokenizer.ggml.merges")) {
    return absl::NotFoundError(
        "tokenizer metadata: tokenizer.ggml.merges is missing (required for tokenizer.ggml.model 'gpt2')");
  }
  if (metadata.Has("tokenizer.ggml.merges")) {
    absl::StatusOr<std::vector<std::string>> merges = metadata.GetStringArray("tokenizer.ggml.merges");
    if (!merges.ok()) return Annotate(merges.status());
    vocab.merges = *std::move(merges);
  }

  const std::pair<std::string_view, std::optional<int64_t>*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &vocab.bos_id},
      {"tokenizer.ggml.eos_token_id", &vocab.eos_id},
      {"tokenizer.ggml.eot_token_id", &vocab.eot_id},
      {"tokenizer.ggml.eom_token_id", &vocab.eom_id},
      {"tokenizer.ggml.unknown_token_id", &vocab.unk_id},
      {"tokenizer.ggml.padding_token_id", &vocab.pad_id},
      {"tokenizer.ggml.seperator_token_id", &vocab.sep_id},  // sic: the key GGUF defines
      {"tokenizer.ggml.fim_pad_token_id", &vocab.fim_pad_id},
      {"tokenizer.ggml.fim_rep_token_id", &vocab.fim_rep_id},
      {"tokenizer.ggml.fim_sep_token_id", &vocab.fim_sep_id},
  };
  for (const auto& [key, out] : ids) RETURN_IF_ERROR(ReadOptionalInt(metadata, key, out));
  RETURN_IF_ERROR(ReadOptionalBool(metadata, "tokenizer.ggml.add_bos_token", &vocab.add_bos));
  RETURN_IF_ERROR(ReadOptionalBool(metadata, "tokenizer.ggml.add_eos_token", &vocab.add_eos));
  RETURN_IF_ERROR(ReadOptionalBool(metadata, "tokenizer.ggml.add_space_prefix", &vocab.add_space_prefix));
  return vocab;
}

// Defined here rather than in tokenizer.cc so that the tokenizer core links without the GGUF reader.
absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromMetadata(const gguf::Metadata& metadata) {
  ASSIGN_OR_RETURN(TokenizerVocab vocab, VocabFromMetadata(metadata));
  return Create(std::move(vocab));
}

}  // namespace strata::tokenizer
