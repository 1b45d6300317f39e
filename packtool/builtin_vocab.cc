#include "packtool/builtin_vocab.h"

#include <array>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace strata::packtool {
namespace {

// GPT-2's reversible byte -> printable code point map.
std::array<std::string, 256> ByteToUnicode() {
  std::array<int, 256> cp{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  int next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = direct[b] ? b : next++;
  std::array<std::string, 256> out;
  for (int b = 0; b < 256; ++b) {
    const int c = cp[b];
    std::string s;
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    out[b] = s;
  }
  return out;
}

// Words whose letters are merged left to right; a leading space is GPT-2's "Ġ".
constexpr const char* kMergeWords[] = {
    " the", " and", " of", " to", " in", " is", " that", " it", " for", " on", " with", " as", " was", " he",
    " be", " at", " by", " this", " had", " not", " are", " but", " from", " or", " have", " an", " they",
    " which", " one", " you", " were", " her", " all", " she", " there", " would", " their", " we", " him",
    " been", " has", " when", " who", " will", " more", " no", " if", " out", " so", " said", " what", " up",
    " its", " about", " into", " than", " them", " can", " only", " other", " new", " some", " could", " time",
    " these", " two", " may", " then", " do", " first", " any", " my", " now", " such", " like", " our",
    " over", " man", " me", " even", " most", " made", " after", " also", " did", " many", " before", " must",
    " through", " back", " years", " where", " much", " your", " way", " well", " down", " should", " because",
    " each", " just", " those", " people", " how", " too", " little", " state", " good", " very", " make",
    " world", " still", " own", " see", " men", " work", " long", " get", " here", " between", " both",
    " life", " being", " under", " never", " day", " same", " another", " know", " while", " last", " might",
    " us", " great", " old", " year", " off", " come", " since", " against", " go", " came", " right",
    " used", " take", " three", "ing", "ed", "er", "es", "ly", "tion", " model", " expert", " token",
    " hello", " Strata", "The", "In", "It", ".\n", ",", " a", " I"};

}  // namespace

absl::StatusOr<VocabMetadata> BuiltinVocab(int64_t n_vocab) {
  const std::array<std::string, 256> byte_str = ByteToUnicode();
  std::vector<std::string> tokens(byte_str.begin(), byte_str.end());
  std::vector<std::string> merges;
  absl::flat_hash_set<std::string> known(tokens.begin(), tokens.end());
  for (const char* word : kMergeWords) {
    std::vector<std::string> pieces;
    for (const char* p = word; *p != '\0'; ++p) pieces.push_back(byte_str[static_cast<unsigned char>(*p)]);
    // Merge left to right: ((a b) c) d ...; every intermediate becomes a token once.
    std::string acc = pieces[0];
    for (size_t i = 1; i < pieces.size(); ++i) {
      const std::string merged = acc + pieces[i];
      if (!known.contains(merged)) {
        merges.push_back(absl::StrCat(acc, " ", pieces[i]));
        tokens.push_back(merged);
        known.insert(merged);
      }
      acc = merged;
    }
  }
  std::vector<int32_t> types(tokens.size(), 1);  // normal
  const int32_t eot = static_cast<int32_t>(tokens.size());
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.emplace_back(special);
    types.push_back(3);  // control
  }
  const int64_t natural = static_cast<int64_t>(tokens.size());
  if (n_vocab != 0 && n_vocab < natural) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab-size: ", n_vocab, " is smaller than the built-in vocabulary (", natural, " tokens)"));
  }
  for (int64_t i = natural; i < n_vocab; ++i) {
    tokens.push_back(absl::StrCat("[PAD", i, "]"));
    types.push_back(5);  // unused
  }
  VocabMetadata v;
  v.n_tokens = static_cast<int64_t>(tokens.size());
  auto string_array = [](const std::vector<std::string>& items) {
    std::vector<gguf::Value> values;
    values.reserve(items.size());
    for (const std::string& s : items) values.push_back(gguf::Value::String(s));
    return gguf::Value::MakeArray(gguf::ValueType::kString, std::move(values));
  };
  std::vector<gguf::Value> type_values;
  for (int32_t t : types) type_values.push_back(gguf::Value::Int32(t));
  v.entries.emplace_back("tokenizer.ggml.model", gguf::Value::String("gpt2"));
  v.entries.emplace_back("tokenizer.ggml.pre", gguf::Value::String("qwen2"));
  v.entries.emplace_back("tokenizer.ggml.tokens", string_array(tokens));
  v.entries.emplace_back("tokenizer.ggml.token_type",
                         gguf::Value::MakeArray(gguf::ValueType::kInt32, std::move(type_values)));
  v.entries.emplace_back("tokenizer.ggml.merges", string_array(merges));
  v.entries.emplace_back("tokenizer.ggml.eos_token_id", gguf::Value::Uint32(static_cast<uint32_t>(eot)));
  v.entries.emplace_back("tokenizer.ggml.bos_token_id", gguf::Value::Uint32(static_cast<uint32_t>(eot)));
  v.entries.emplace_back("tokenizer.ggml.padding_token_id", gguf::Value::Uint32(static_cast<uint32_t>(eot)));
  v.entries.emplace_back("tokenizer.ggml.add_bos_token", gguf::Value::Bool(false));
  v.entries.emplace_back("tokenizer.chat_template", gguf::Value::String(kBuiltinChatTemplate));
  return v;
}

absl::StatusOr<VocabMetadata> VocabFromGguf(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<gguf::GgufFile> file, gguf::GgufFile::Open(path));
  VocabMetadata v;
  for (const auto& [key, value] : file->metadata().entries()) {
    if (absl::StartsWith(key, "tokenizer.")) v.entries.emplace_back(key, value);
  }
  auto tokens = file->metadata().GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab ", path, ": no tokenizer: ", tokens.status().message()));
  }
  v.n_tokens = static_cast<int64_t>(tokens->size());
  return v;
}

}  // namespace strata::packtool
