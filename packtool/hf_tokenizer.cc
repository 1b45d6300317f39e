#include "packtool/hf_tokenizer.h"


#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/status_macros.h"
#include "nlohmann/json.hpp"
#include "packtool/json_file.h"

namespace strata::packtool {
namespace {

using nlohmann::json;

// json::value() throws on a value of another type; a field of the wrong type reads as absent here instead.
std::string StringOr(const json& j, const char* key, const std::string& fallback) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}
bool BoolOr(const json& j, const char* key, bool fallback) {
  return j.is_object() && j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

constexpr int32_t kTypeNormal = 1, kTypeControl = 3, kTypeUserDefined = 4, kTypeUnused = 5;

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// Every Split regex and whether a ByteLevel step with use_regex (GPT-2's regex) is among the pre-tokenizers.
void CollectPreTokenizers(const json& p, std::vector<std::string>* regexes, bool* byte_level_regex) {
  if (!p.is_object()) return;
  const std::string type = StringOr(p, "type", "");
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    for (const json& q : p["pretokenizers"]) CollectPreTokenizers(q, regexes, byte_level_regex);
  } else if (type == "Split" && p.contains("pattern") && p["pattern"].is_object() &&
             p["pattern"].contains("Regex") && p["pattern"]["Regex"].is_string()) {
    // Control characters as the escapes they match (tokenizer.json files write "\r" either way).
    std::string regex = absl::StrReplaceAll(p["pattern"]["Regex"].get<std::string>(), {{"\r", "\\r"}, {"\n", "\\n"}});
    regexes->push_back(std::move(regex));
  } else if (type == "ByteLevel") {
    *byte_level_regex = BoolOr(p, "use_regex", true);
  }
}

absl::StatusOr<std::string> PreTokenizerName(const json& tok, const std::string& path) {
  std::vector<std::string> regexes;
  bool byte_level_regex = false;
  if (tok.contains("pre_tokenizer")) CollectPreTokenizers(tok["pre_tokenizer"], &regexes, &byte_level_regex);
  if (regexes.size() == 1 && !byte_level_regex) {
    if (regexes[0] == kHfQwen2PreRegex) return std::string("qwen2");
    if (regexes[0] == kHfLlama3PreRegex) return std::string("llama3");
    if (regexes[0] == kHfGpt4oPreRegex) return std::string("gpt-4o");
  }
  if (regexes.size() == 3 && !byte_level_regex && regexes[0] == kHfDeepseekV3PreRegexes[0] &&
      regexes[1] == kHfDeepseekV3PreRegexes[1] && regexes[2] == kHfDeepseekV3PreRegexes[2]) {
    return std::string("deepseek-v3");
  }
  if (regexes.empty() && byte_level_regex) return std::string("gpt-2");
  return Bad(path, "pre_tokenizer: not one Strata knows (expected the qwen2, llama3, gpt-4o, deepseek-v3 or GPT-2 "
                   "byte-level regexes); "
                   "pass --tokenizer-gguf with a GGUF holding this model's tokenizer");
}

// A token named by tokenizer_config.json: a string, or an object with "content".
std::optional<std::string> TokenText(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

absl::StatusOr<VocabMetadata> VocabFromHfTokenizer(const HfTokenizerOptions& options) {
  const std::string path = options.dir + "/tokenizer.json";
  absl::StatusOr<json> read = ReadJsonFile(path);
  if (absl::IsNotFound(read.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": missing; pass --tokenizer-gguf with a GGUF holding this model's tokenizer"));
  }
  RETURN_IF_ERROR(read.status());
  const json& tok = *read;
  if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object()) {
    return Bad(path, "expected an object with a \"model\" object");
  }
  const json& model = tok["model"];
  const std::string type = StringOr(model, "type", "");
  if (type != "BPE") {
    return Bad(path, absl::StrCat("model.type '", type, "': only byte-level BPE is read; pass --tokenizer-gguf"));
  }
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>()) {
    return Bad(path, "model.byte_fallback: a SentencePiece-style BPE, not byte-level; pass --tokenizer-gguf");
  }
  ASSIGN_OR_RETURN(const std::string pre, PreTokenizerName(tok, path));

  if (!model.contains("vocab") || !model["vocab"].is_object()) return Bad(path, "model.vocab: expected an object");
  // Ids may come in any order and with gaps; more than 2^24 of them is no tokenizer.
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  absl::flat_hash_map<int64_t, std::pair<std::string, int32_t>> by_id;
  int64_t n_tokens = std::max<int64_t>(options.n_vocab, 0);
  auto add = [&](const std::string& where, const json& id_json, const std::string& text,
                 int32_t type_code) -> absl::Status {
    if (!id_json.is_number_unsigned() || id_json.get<uint64_t>() >= static_cast<uint64_t>(kMaxTokens)) {
      return Bad(path, absl::StrCat(where, ": expected a token id in 0 .. 2^24"));
    }
    const int64_t id = id_json.get<int64_t>();
    by_id[id] = {text, type_code};  // an added token replaces the vocabulary's entry of its id
    n_tokens = std::max(n_tokens, id + 1);
    return absl::OkStatus();
  };
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    RETURN_IF_ERROR(add(absl::StrCat("model.vocab['", it.key(), "']"), it.value(), it.key(), kTypeNormal));
  }
  if (tok.contains("added_tokens")) {
    if (!tok["added_tokens"].is_array()) return Bad(path, "added_tokens: expected an array");
    size_t i = 0;
    for (const json& a : tok["added_tokens"]) {
      const std::string where = absl::StrCat("added_tokens[", i++, "]");
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string()) {
        return Bad(path, absl::StrCat(where, ": expected an object with id and content"));
      }
      const bool special = BoolOr(a, "special", false);
      RETURN_IF_ERROR(add(where, a["id"], a["content"].get<std::string>(), special ? kTypeControl : kTypeUserDefined));
    }
  }
  std::vector<gguf::Value> tokens, types;
  absl::flat_hash_map<std::string, int64_t> id_of;
  for (int64_t id = 0; id < n_tokens; ++id) {
    auto it = by_id.find(id);
    std::string text = it == by_id.end() ? absl::StrCat("[PAD", id, "]") : it->second.first;
    types.push_back(gguf::Value::Int32(it == by_id.end() ? kTypeUnused : it->second.second));
    id_of.emplace(text, id);
    tokens.push_back(gguf::Value::String(std::move(text)));
  }

  if (!model.contains("merges") || !model["merges"].is_array()) return Bad(path, "model.merges: expected an array");
  std::vector<gguf::Value> merges;
  size_t i = 0;
  for (const json& m : model["merges"]) {
    // Older files write "a b", newer ones ["a", "b"] (which allows spaces inside the pieces).
    if (m.is_string()) {
      merges.push_back(gguf::Value::String(m.get<std::string>()));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(gguf::Value::String(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>())));
    } else {
      return Bad(path, absl::StrCat("model.merges[", i, "]: expected \"a b\" or [\"a\", \"b\"]"));
    }
    ++i;
  }

  VocabMetadata v;
  v.n_tokens = n_tokens;
  v.entries.emplace_back("tokenizer.ggml.model", gguf::Value::String("gpt2"));
  v.entries.emplace_back("tokenizer.ggml.pre", gguf::Value::String(pre));
  v.entries.emplace_back("tokenizer.ggml.tokens", gguf::Value::MakeArray(gguf::ValueType::kString, std::move(tokens)));
  v.entries.emplace_back("tokenizer.ggml.token_type",
                         gguf::Value::MakeArray(gguf::ValueType::kInt32, std::move(types)));
  v.entries.emplace_back("tokenizer.ggml.merges", gguf::Value::MakeArray(gguf::ValueType::kString, std::move(merges)));

  // tokenizer_config.json is optional; its tokens are named by text.
  const std::string config_path = options.dir + "/tokenizer_config.json";
  absl::StatusOr<json> config = ReadJsonFile(config_path);
  if (!config.ok() && !absl::IsNotFound(config.status())) return config.status();
  const json tc = config.ok() && config->is_object() ? *config : json::object();
  auto special_id = [&](const char* key, std::optional<int64_t> fallback) -> absl::StatusOr<std::optional<int64_t>> {
    std::optional<std::string> text = TokenText(tc, key);
    if (!text) return fallback;
    auto it = id_of.find(*text);
    if (it == id_of.end()) return Bad(config_path, absl::StrCat(key, " '", *text, "' is not a token of ", path));
    return std::optional<int64_t>(it->second);
  };
  for (auto [key, gguf_key, fallback] :
       {std::tuple{"eos_token", "tokenizer.ggml.eos_token_id", options.eos_id},
        std::tuple{"bos_token", "tokenizer.ggml.bos_token_id", options.bos_id},
        std::tuple{"pad_token", "tokenizer.ggml.padding_token_id", std::optional<int64_t>()}}) {
    ASSIGN_OR_RETURN(std::optional<int64_t> id, special_id(key, fallback));
    if (!id) continue;
    if (*id < 0 || *id >= n_tokens) {
      return Bad(path, absl::StrCat(key, " id ", *id, " is outside the ", n_tokens, " tokens"));
    }
    v.entries.emplace_back(gguf_key, gguf::Value::Uint32(static_cast<uint32_t>(*id)));
  }
  if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean()) {
    v.entries.emplace_back("tokenizer.ggml.add_bos_token", gguf::Value::Bool(tc["add_bos_token"].get<bool>()));
  }
  if (tc.contains("chat_template") && tc["chat_template"].is_string()) {
    v.entries.emplace_back("tokenizer.chat_template", gguf::Value::String(tc["chat_template"].get<std::string>()));
  }
  return v;
}

}  // namespace strata::packtool
