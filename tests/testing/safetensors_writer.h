#ifndef STRATA_TESTS_TESTING_SAFETENSORS_WRITER_H_
#define STRATA_TESTS_TESTING_SAFETENSORS_WRITER_H_

// Writes .safetensors files for tests (the reader lives in packtool/safetensors.h).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace strata::testing {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;             // "F16", "BF16", "F32" (or anything, to test refusals)
  std::vector<int64_t> shape;    // row-major
  std::vector<uint8_t> bytes;
};

// The header JSON the writer would write for `entries` (offsets packed in order).
std::string SafetensorsHeaderJson(const std::vector<SafetensorsEntry>& entries);

// Writes the 8-byte length, `header_json` (padded with spaces to a multiple of 8, as the Python writer does)
// and `data` verbatim.
absl::Status WriteSafetensorsRaw(const std::string& path, const std::string& header_json,
                                 const std::vector<uint8_t>& data);

// Writes `entries` as a well-formed file.
absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries);

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_SAFETENSORS_WRITER_H_
