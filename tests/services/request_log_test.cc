#include "services/request_log.h"

#include "gtest/gtest.h"

namespace strata::services {
namespace {

TEST(RequestLogTest, OneLineOfKeyValuePairs) {
  RequestLogRecord r;
  r.id = "7";
  r.method = "Generate";
  r.peer = "ipv4:127.0.0.1:50312";
  r.prompt_tokens = 12;
  r.completion_tokens = 40;
  r.ttft_seconds = 0.0314;
  r.total_seconds = 0.4116;
  r.finish = "eos";
  EXPECT_EQ(FormatRequestLog(r),
            "request id=7 method=Generate peer=ipv4:127.0.0.1:50312 prompt_tokens=12 completion_tokens=40 "
            "ttft_s=0.031 total_s=0.412 finish=eos status=OK");
}

TEST(RequestLogTest, AFailureCarriesItsMessageQuotedAndMissingValuesAreDashes) {
  RequestLogRecord r;
  r.id = "req \"a\"=1";
  r.method = "Generate";
  r.peer = "ipv4:10.0.0.7:1";
  r.total_seconds = 0.002;
  r.status = absl::InvalidArgumentError("sampling.max_tokens: 9000 tokens exceed\nthe limit");
  EXPECT_EQ(FormatRequestLog(r),
            "request id=\"req \\\"a\\\"=1\" method=Generate peer=ipv4:10.0.0.7:1 prompt_tokens=0 "
            "completion_tokens=0 ttft_s=- total_s=0.002 finish=- status=INVALID_ARGUMENT "
            "message=\"sampling.max_tokens: 9000 tokens exceed\\x0athe limit\"");
}

}  // namespace
}  // namespace strata::services
