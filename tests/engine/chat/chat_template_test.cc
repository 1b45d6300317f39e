// ChatTemplate. Every chat template of tests/data/chat-templates, rendered for several conversations by
// the C++ interpreter and by Python's jinja2 (render_with_jinja2.py, run here: scripts/setup installs
// python3-jinja2), must give the same bytes, or both refuse the conversation with the same message.

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/jinja_builtins.h"
#include "engine/chat/jinja_value.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::chat {
namespace {

namespace fs = std::filesystem;
using jinja::Value;
using jinja::ValueDict;
using jinja::ValueList;

constexpr int kNow[6] = {2025, 3, 7, 14, 5, 9};  // the time strftime_now sees on both sides

std::tm FixedNow() {
  std::tm tm{};
  tm.tm_year = kNow[0] - 1900;
  tm.tm_mon = kNow[1] - 1;
  tm.tm_mday = kNow[2];
  tm.tm_hour = kNow[3];
  tm.tm_min = kNow[4];
  tm.tm_sec = kNow[5];
  std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);  // fills the weekday and day of the year
  return tm;
}

struct Conversation {
  std::string name;
  std::vector<ChatMessage> messages;
  ChatOptions options;
};

ChatOptions Options(bool add_generation_prompt, std::optional<bool> enable_thinking) {
  ChatOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.enable_thinking = enable_thinking;
  return o;
}

std::vector<Conversation> Conversations() {
  const ChatOptions on = Options(true, std::nullopt);
  const ChatOptions off = Options(false, std::nullopt);
  const ChatMessage system{"system", "You are a terse assistant."};
  return {
      {"user_only", {{"user", "Hello!"}}, on},
      {"user_only_no_prompt", {{"user", "Hello!"}}, off},
      {"system_user", {system, {"user", "What is 2+2?"}}, on},
      {"multi_turn", {system, {"user", "Hi"}, {"assistant", "Hello. How can I help?"}, {"user", "Name a colour."}}, on},
      {"multi_turn_no_system_ending_with_assistant",
       {{"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}, {"assistant", "Goodbye."}},
       off},
      {"reasoning_in_history",
       {{"user", "Why?"}, {"assistant", "<think>\nThe user asks why.\n</think>\n\nBecause."}, {"user", "Sure?"}},
       on},
      {"final_assistant_with_reasoning", {{"user", "Why?"}, {"assistant", "<think>\nhmm\n</think>\n\nYes."}}, off},
      {"unicode_and_whitespace",
       {{"system", "  Sé breve. \n"},
        {"user", "  Héllo ✓ 世界 🙂\n\n\ttabs, \"double\" and 'single' quotes, a \\ backslash  "}},
       on},
      {"thinking_off", {{"user", "Quick answer: 3*7?"}}, Options(true, false)},
      {"thinking_on", {{"user", "Think about 3*7."}}, Options(true, true)},
      {"tool_result", {{"user", "Weather?"}, {"assistant", "Let me check."}, {"tool", "{\"temp\": 21}"}}, on},
      {"two_users_in_a_row", {{"user", "One."}, {"user", "Two."}}, on},
      {"two_system_messages", {system, {"system", "Answer in French."}, {"user", "Hello"}}, on},
      {"empty_content", {{"user", ""}}, on},
  };
}

std::vector<std::string> TemplateFiles() {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(strata::testing::TestDataDir() + "/chat-templates")) {
    if (entry.path().extension() == ".jinja") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Value MessagesValue(const std::vector<ChatMessage>& messages) {
  ValueList list;
  for (const ChatMessage& m : messages) {
    ValueDict d;
    d.Set("role", Value::String(m.role));
    d.Set("content", Value::String(m.content));
    list.push_back(Value::Dict(std::move(d)));
  }
  return Value::List(std::move(list));
}

struct Expected {
  bool ok;
  std::string text;  // the rendering, or the error
};

// Runs render_with_jinja2.py over the cases; one result per case.
std::vector<Expected> RenderWithJinja2(const std::string& cases_json, const strata::testing::ScratchDir& dir) {
  const std::string cases = dir.Join("cases.json"), out = dir.Join("out.bin");
  std::ofstream(cases, std::ios::binary) << cases_json;
  const std::string script = std::string(STRATA_SOURCE_DIR) + "/tests/engine/chat/render_with_jinja2.py";
  const std::string cmd = absl::StrCat("'", STRATA_PYTHON3, "' '", script, "' '", cases, "' '", out, "'");
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << " failed: Python's jinja2 is needed (scripts/setup installs python3-jinja2)";
  std::vector<Expected> results;
  const std::string data = ReadText(out);
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t nl = data.find('\n', pos);
    if (nl == std::string::npos) break;
    const std::string header = data.substr(pos, nl - pos);
    const size_t space = header.find(' ');
    const size_t n = std::stoul(header.substr(space + 1));
    results.push_back({header.substr(0, space) == "OK", data.substr(nl + 1, n)});
    pos = nl + 1 + n;
  }
  return results;
}

TEST(ChatTemplateJinja2Test, EveryTemplateRendersEveryConversationAsJinja2Does) {
  const std::vector<std::string> templates = TemplateFiles();
  ASSERT_GE(templates.size(), 7u);
  const std::vector<Conversation> conversations = Conversations();
  ValueList cases;
  for (const std::string& path : templates) {
    for (const Conversation& c : conversations) {
      ValueDict d;
      d.Set("template", Value::String(path));
      d.Set("messages", MessagesValue(c.messages));
      d.Set("add_generation_prompt", Value::Bool(c.options.add_generation_prompt));
      d.Set("bos_token", Value::String("<s>"));
      d.Set("eos_token", Value::String("</s>"));
      ValueList now;
      for (int v : kNow) now.push_back(Value::Int(v));
      d.Set("now", Value::List(std::move(now)));
      if (c.options.enable_thinking.has_value()) d.Set("enable_thinking", Value::Bool(*c.options.enable_thinking));
      cases.push_back(Value::Dict(std::move(d)));
    }
  }
  absl::StatusOr<std::string> json = jinja::ToJson(Value::List(std::move(cases)), {});
  ASSERT_TRUE(json.ok()) << json.status();
  strata::testing::ScratchDir dir;
  const std::vector<Expected> expected = RenderWithJinja2(*json, dir);
  ASSERT_EQ(expected.size(), templates.size() * conversations.size());

  size_t index = 0, rendered = 0, refused = 0;
  for (const std::string& path : templates) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Create(ReadText(path), "<s>", "</s>", FixedNow);
    ASSERT_TRUE(t.ok()) << path << ": " << t.status();
    for (const Conversation& c : conversations) {
      const Expected& want = expected[index++];
      SCOPED_TRACE(absl::StrCat(fs::path(path).filename().string(), " / ", c.name));
      absl::StatusOr<std::string> got = (*t)->Render(c.messages, c.options);
      if (want.ok) {
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, want.text);
        ++rendered;
      } else {
        ASSERT_FALSE(got.ok()) << "jinja2 refused with: " << want.text << "\nbut C++ rendered:\n" << *got;
        EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
        if (want.text.rfind("jinja2: ", 0) != 0) {
          EXPECT_EQ(got.status().message(), absl::StrCat(jinja::kRaisedPrefix, want.text));
        }
        ++refused;
      }
    }
  }
  // Most cases render; a few are refused by the templates themselves (Mistral's alternation rule, gpt-oss's
  // tool messages), which the comparison must also cover.
  EXPECT_GT(rendered, 80u);
  EXPECT_GT(refused, 0u);
}

TEST(ChatTemplateTest, ATemplateThatCannotRenderTheProbeIsRefusedNamingWhy) {
  EXPECT_THAT(ChatTemplate::Create("{{ messages[0].content.zfill(3) }}", "", "").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "user/assistant/user conversation"));
  EXPECT_THAT(ChatTemplate::Create("{{ raise_exception('no chat here') }}", "", "").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "no chat here"));
  // A template may refuse system messages itself (some models have no system role) and still load.
  absl::StatusOr<std::unique_ptr<ChatTemplate>> no_system = ChatTemplate::Create(
      "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}[{{ m.role }}]{% endfor %}",
      "", "");
  ASSERT_TRUE(no_system.ok()) << no_system.status();
  const std::vector<ChatMessage> with_system = {{"system", "s"}, {"user", "u"}};
  EXPECT_THAT((*no_system)->Render(with_system, ChatOptions{}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "System role not supported"));
}

TEST(ChatTemplateTest, RendersBosEosAndTheGenerationPromptFlag) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Create(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}"
      "{% if add_generation_prompt %}assistant:{% endif %}{% if enable_thinking is defined %}"
      "{{ enable_thinking }}{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<ChatMessage> messages = {{"user", "hi"}};
  EXPECT_EQ(*(*t)->Render(messages, Options(true, std::nullopt)), "<s>user:hi</s>assistant:");
  EXPECT_EQ(*(*t)->Render(messages, Options(false, false)), "<s>user:hi</s>False");
  EXPECT_THAT((*t)->Render({}, ChatOptions{}).status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "messages"));
  const std::vector<ChatMessage> bad_role = {{"user", "hi"}, {"developer", "x"}};
  EXPECT_THAT((*t)->Render(bad_role, ChatOptions{}).status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "messages[1].role: 'developer'"));
}

TEST(ChatTemplateTest, ARenderedPromptGetsBosAddedUnlessTheTemplateWroteIt) {
  // Two vocabularies with BOS texts of their own (SentencePiece's "<s>", GPT-2's).
  for (const char* vocab : {"ggml-vocab-llama-spm.gguf.gz", "ggml-vocab-gpt-2.gguf.gz"}) {
    absl::StatusOr<std::unique_ptr<gguf::GgufFile>> file =
        gguf::GgufFile::Open(strata::testing::TestDataFile(absl::StrCat("vocab/", vocab)));
    ASSERT_TRUE(file.ok()) << file.status();
    absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tokenizer =
        tokenizer::Tokenizer::FromMetadata((*file)->metadata());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const std::string bos((*tokenizer)->bos() >= 0 ? (*tokenizer)->TokenText((*tokenizer)->bos()) : "");
    EXPECT_TRUE(AddSpecialToRendered("[INST] hi [/INST]", **tokenizer)) << vocab;
    EXPECT_EQ(AddSpecialToRendered(bos + "[INST] hi [/INST]", **tokenizer), bos.empty()) << vocab << " bos '" << bos << "'";
  }
}

}  // namespace
}  // namespace strata::chat
