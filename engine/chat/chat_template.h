#ifndef STRATA_ENGINE_CHAT_CHAT_TEMPLATE_H_
#define STRATA_ENGINE_CHAT_CHAT_TEMPLATE_H_

// A model's chat template (GGUF `tokenizer.chat_template`, Jinja): turns a conversation into the prompt
// text the model was trained on, as Hugging Face transformers renders it (apply_chat_template with
// tokenize=False). The template sees `messages` (dicts with "role" and "content"), `add_generation_prompt`,
// `bos_token`, `eos_token`, `enable_thinking` when the caller sets it, and the globals raise_exception,
// strftime_now, namespace, range and dict.
//
// Create parses the template and renders probe conversations, so that a template using what the Jinja
// subset lacks is refused when the model loads, naming it, not when the first user arrives.
//
// Immutable after creation; Render may be called from any number of threads at once.

#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/jinja_ast.h"
#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"

namespace strata::chat {

inline constexpr char kChatTemplateKey[] = "tokenizer.chat_template";

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;   // end with the header of the assistant's reply
  std::optional<bool> enable_thinking; // passed to templates that read it (Qwen3, DeepSeek-V3.1, GLM-4.6)
};

// The local time strftime_now formats.
std::tm LocalNow();

class ChatTemplate {
 public:
  // `source` is the Jinja text; `bos_token` / `eos_token` the texts of the vocabulary's BOS / EOS ("" when
  // none). INVALID_ARGUMENT naming the line and what is unsupported when the template cannot be parsed or
  // cannot render the probe conversations.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(std::string source, std::string bos_token,
                                                              std::string eos_token,
                                                              std::function<std::tm()> now = LocalNow);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // INVALID_ARGUMENT naming the message for an empty conversation or an unknown role
  // ("messages[2].role: ..."), with the template's own message when it refuses the conversation
  // (raise_exception), or naming the template line where rendering failed.
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages, const ChatOptions& options) const;

  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;

  std::string source_;
  std::string bos_token_, eos_token_;
  std::function<std::tm()> now_;
  jinja::Body body_;
};

// The template of a model: `override_source` when non-empty, else the metadata's tokenizer.chat_template;
// null (and OK) when neither is there. Errors name the key (or "chat template override") first.
absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(const gguf::Metadata& metadata,
                                                               const tokenizer::Tokenizer& tokenizer,
                                                               const std::string& override_source);

// Whether a rendered conversation is tokenized with the vocabulary's special tokens added (BOS, as it asks):
// not when the template already wrote BOS itself (DeepSeek, Mistral), which must not appear twice.
bool AddSpecialToRendered(std::string_view prompt, const tokenizer::Tokenizer& tokenizer);

}  // namespace strata::chat

#endif  // STRATA_ENGINE_CHAT_CHAT_TEMPLATE_H_
