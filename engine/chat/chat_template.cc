#include "engine/chat/chat_template.h"

#include <ctime>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_builtins.h"
#include "engine/chat/jinja_interpreter.h"
#include "engine/chat/jinja_parser.h"
#include "engine/status_macros.h"

namespace strata::chat {
namespace {

bool KnownRole(std::string_view role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

// What each probe renders: a plain conversation every chat template must take, and one with a system
// message, which a template may refuse with raise_exception (some models have no system role).
std::vector<ChatMessage> PlainProbe() {
  return {{"user", "Hello"}, {"assistant", "Hi, how can I help?"}, {"user", "Tell me a joke."}};
}
std::vector<ChatMessage> SystemProbe() {
  std::vector<ChatMessage> m = PlainProbe();
  m.insert(m.begin(), {"system", "You are a helpful assistant."});
  return m;
}

bool RaisedByTemplate(const absl::Status& status) { return absl::StartsWith(status.message(), jinja::kRaisedPrefix); }

}  // namespace

std::tm LocalNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(std::string source, std::string bos_token,
                                                                   std::string eos_token,
                                                                   std::function<std::tm()> now) {
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  absl::StatusOr<jinja::Body> body = jinja::ParseTemplate(source);
  if (!body.ok()) return absl::InvalidArgumentError(body.status().message());
  t->body_ = *std::move(body);
  t->source_ = std::move(source);
  t->bos_token_ = std::move(bos_token);
  t->eos_token_ = std::move(eos_token);
  t->now_ = std::move(now);
  for (bool generation_prompt : {true, false}) {
    ChatOptions options;
    options.add_generation_prompt = generation_prompt;
    absl::StatusOr<std::string> plain = t->Render(PlainProbe(), options);
    if (!plain.ok()) {
      return absl::InvalidArgumentError(
          jinja::Cat("cannot render a user/assistant/user conversation: ", plain.status().message()));
    }
    absl::StatusOr<std::string> with_system = t->Render(SystemProbe(), options);
    if (!with_system.ok() && !RaisedByTemplate(with_system.status())) {
      return absl::InvalidArgumentError(
          jinja::Cat("cannot render a conversation with a system message: ", with_system.status().message()));
    }
  }
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                 const ChatOptions& options) const {
  if (messages.empty()) return absl::InvalidArgumentError("messages: the conversation is empty");
  jinja::ValueList list;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!KnownRole(messages[i].role)) {
      return absl::InvalidArgumentError(jinja::Cat("messages[", i, "].role: '", messages[i].role,
                                                     "' is not one of system, user, assistant, tool"));
    }
    jinja::ValueDict m;
    m.Set("role", jinja::Value::String(messages[i].role));
    m.Set("content", jinja::Value::String(messages[i].content));
    list.push_back(jinja::Value::Dict(std::move(m)));
  }
  jinja::ValueDict vars;
  vars.Set("messages", jinja::Value::List(std::move(list)));
  vars.Set("add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt));
  vars.Set("bos_token", jinja::Value::String(bos_token_));
  vars.Set("eos_token", jinja::Value::String(eos_token_));
  vars.Set("tools", jinja::Value::None());  // as transformers passes it when there are no tools
  if (options.enable_thinking.has_value()) vars.Set("enable_thinking", jinja::Value::Bool(*options.enable_thinking));
  const jinja::ValueDict globals = jinja::BuiltinGlobals(now_);
  return jinja::RenderTemplate(body_, globals, vars);
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(const gguf::Metadata& metadata,
                                                               const tokenizer::Tokenizer& tokenizer,
                                                               const std::string& override_source) {
  std::string source = override_source;
  std::string origin = "chat template override";
  if (source.empty()) {
    if (!metadata.Has(kChatTemplateKey)) return nullptr;
    ASSIGN_OR_RETURN(source, metadata.GetString(kChatTemplateKey));
    origin = kChatTemplateKey;
  }
  const auto token_text = [&](int32_t id) { return id >= 0 ? std::string(tokenizer.TokenText(id)) : std::string(); };
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      ChatTemplate::Create(std::move(source), token_text(tokenizer.bos()), token_text(tokenizer.eos()));
  if (!t.ok()) {
    return absl::InvalidArgumentError(jinja::Cat(origin, ": ", t.status().message()));
  }
  return t;
}

bool AddSpecialToRendered(std::string_view prompt, const tokenizer::Tokenizer& tokenizer) {
  const std::string_view bos = tokenizer.bos() >= 0 ? tokenizer.TokenText(tokenizer.bos()) : "";
  return bos.empty() || !prompt.starts_with(bos);
}

}  // namespace strata::chat
