// Real GGUF files written by llama.cpp's converter (tests/data/vocab; facts from SOURCE.txt there).

#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::gguf {
namespace {

using ::strata::testing::TestDataFile;

// The unpacked copy of vocab/<name>.gz.
std::string VocabPath(const std::string& name) { return TestDataFile("vocab/" + name + ".gz"); }

TEST(GgufVocab, Gpt2) {
  auto file = GgufFile::Open(VocabPath("ggml-vocab-gpt-2.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  const Metadata& md = (*file)->metadata();
  EXPECT_EQ(*md.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*md.GetString("tokenizer.ggml.pre"), "gpt-2");
  absl::StatusOr<std::vector<std::string>> tokens = md.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 50257u);
  EXPECT_EQ((*tokens)[0], "!");
  EXPECT_EQ((*tokens)[50256], "<|endoftext|>");
  absl::StatusOr<std::vector<std::string>> merges = md.GetStringArray("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok()) << merges.status();
  EXPECT_GT(merges->size(), 40000u);
  EXPECT_TRUE((*file)->tensors().empty());
  EXPECT_EQ((*file)->alignment(), 32u);

  auto model = GgufModel::Open(VocabPath("ggml-vocab-gpt-2.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*(*model)->metadata().GetString("tokenizer.ggml.model"), "gpt2");
}

TEST(GgufVocab, LlamaSpm) {
  auto file = GgufFile::Open(VocabPath("ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  const Metadata& md = (*file)->metadata();
  EXPECT_EQ(*md.GetString("tokenizer.ggml.model"), "llama");
  ASSERT_EQ(md.GetStringArray("tokenizer.ggml.tokens")->size(), 32000u);
  EXPECT_EQ((*md.GetStringArray("tokenizer.ggml.tokens"))[1], "<s>");
  EXPECT_EQ(md.GetFloatArray("tokenizer.ggml.scores")->size(), 32000u);
  EXPECT_EQ(md.GetIntArray("tokenizer.ggml.token_type")->size(), 32000u);
  EXPECT_TRUE(*md.GetBool("tokenizer.ggml.add_bos_token"));
}

TEST(GgufVocab, GptNeox) {
  auto file = GgufFile::Open(VocabPath("ggml-vocab-gpt-neox.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().GetStringArray("tokenizer.ggml.tokens")->size(), 50432u);
  EXPECT_FALSE((*file)->metadata().Has("tokenizer.ggml.pre"));
}

TEST(GgufVocab, Qwen2) {
  auto file = GgufFile::Open(VocabPath("ggml-vocab-qwen2.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->file_size(), 5928896u);
  const Metadata& md = (*file)->metadata();
  EXPECT_EQ(*md.GetString("tokenizer.ggml.pre"), "qwen2");
  absl::StatusOr<std::vector<std::string>> tokens = md.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 151936u);
  EXPECT_EQ((*tokens)[151644], "<|im_start|>");
  EXPECT_EQ(md.GetStringArray("tokenizer.ggml.merges")->size(), 151387u);
}

}  // namespace
}  // namespace strata::gguf
