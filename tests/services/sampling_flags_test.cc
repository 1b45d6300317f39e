#include "services/sampling_flags.h"

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

using runtime::SamplingParams;

TEST(SamplingFlagsTest, TheDefaultsPass) { EXPECT_TRUE(CheckSamplingFlags(SamplingParams()).ok()); }

TEST(SamplingFlagsTest, EachBadValueNamesTheFlagTheUserTyped) {
  struct Case {
    void (*set)(SamplingParams*);
    const char* message;
  };
  const Case cases[] = {
      {[](SamplingParams* p) { p->temperature = -1; }, "--temperature: -1 is negative"},
      {[](SamplingParams* p) { p->top_k = -2; }, "--top-k: -2 is negative"},
      {[](SamplingParams* p) { p->top_p = 2; }, "--top-p: 2 is not in (0, 1]"},
      {[](SamplingParams* p) { p->min_p = 1.5f; }, "--min-p: 1.5 is not in [0, 1]"},
      {[](SamplingParams* p) { p->repetition_penalty = 0; }, "--repeat-penalty: 0 must be > 0"},
      {[](SamplingParams* p) { p->penalty_last_n = -3; }, "--penalty-last-n: -3 must be"},
      {[](SamplingParams* p) { p->max_tokens = 0; }, "--max-tokens: 0 must be >= 1"},
      {[](SamplingParams* p) { p->stop = {"a", ""}; }, "--stop[1] is empty"},
      {[](SamplingParams* p) { p->stop_token_ids.assign(65, 1); }, "--stop-token-ids: 65 ids exceed the limit"},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(&p);
    const absl::Status s = CheckSamplingFlags(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(std::string(s.message()).rfind(c.message, 0), 0u) << s.message();
  }
}

TEST(SamplingFlagsTest, OnlyALeadingFieldNameIsRenamed) {
  const absl::Status other = absl::InvalidArgumentError("prompt: empty");
  EXPECT_EQ(NameSamplingFlag(other), other);
  const absl::Status prefix = absl::InvalidArgumentError("top_pp: not a field");
  EXPECT_EQ(NameSamplingFlag(prefix), prefix);
  EXPECT_TRUE(NameSamplingFlag(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace strata::services
