#ifndef STRATA_SERVICES_REQUEST_LOG_H_
#define STRATA_SERVICES_REQUEST_LOG_H_

// The structured line a server logs when a request ends, key=value pairs in a fixed order:
//
//   request id=7 method=Generate peer=ipv4:127.0.0.1:50312 prompt_tokens=12 completion_tokens=40
//           ttft_s=0.031 total_s=0.412 finish=eos status=OK
//
// (one line). A value holding a space, '"', '=' or a control character is written in double quotes with
// '"' and '\' escaped; a non-OK status adds message="...". Times are seconds. Pure function.

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace strata::services {

struct RequestLogRecord {
  std::string id;      // the client's x-request-id, or one the server numbered
  std::string method;  // "Generate"
  std::string peer;    // gRPC's peer string
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double ttft_seconds = -1;  // negative: no token was sampled (written as "-")
  double total_seconds = 0;  // from the call's arrival to its end
  std::string finish;        // "stop", "length", "eos", "cancelled", "error"; empty: none (written as "-")
  absl::Status status;
};

std::string FormatRequestLog(const RequestLogRecord& record);

}  // namespace strata::services

#endif  // STRATA_SERVICES_REQUEST_LOG_H_
