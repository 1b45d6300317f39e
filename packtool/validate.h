#ifndef STRATA_PACKTOOL_VALIDATE_H_
#define STRATA_PACKTOOL_VALIDATE_H_

// Validates a pack directory and lists every problem found.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::packtool {

struct ValidateOptions {
  bool quick = false;  // skip the per-blob checksums
  int threads = 0;     // 0 = one per core this process may use
  // When it turns true (from any thread), the checksums stop and ValidatePack returns CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

struct ValidationProblem {
  std::string file;     // "manifest.json", "experts.bin", "dense.gguf", "routing_profile.bin" or the directory
  std::string message;  // one line: what is wrong, with expected and actual values
};

struct ValidationReport {
  std::vector<ValidationProblem> problems;
  uint64_t blobs_checked = 0;
  uint64_t bytes_checked = 0;
  double seconds = 0;
  double gb_per_second = 0;  // checksum rate over experts.bin
  bool ok() const { return problems.empty(); }
};

// Checks that the files are present, the manifest is known and consistent, experts.bin has exactly
// n_moe_layers x n_expert x blob_bytes bytes, every blob's checksum (unless quick; in parallel), and that
// dense.gguf parses and agrees with the manifest's architecture and geometry, and the routing profile (when
// there is one) as Pack::Open reads it. Only a directory that cannot be
// read at all (or a cancelled validation) is an error status; everything else is a problem in the report.
absl::StatusOr<ValidationReport> ValidatePack(const std::string& pack_dir, const ValidateOptions& options);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_VALIDATE_H_
