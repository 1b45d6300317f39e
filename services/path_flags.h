#ifndef STRATA_SERVICES_PATH_FLAGS_H_
#define STRATA_SERVICES_PATH_FLAGS_H_

// Checks of the paths a binary's flags name, made before any work (loading, generating) so that a typo
// costs nothing; and the one way the CLIs write a result file. Every error names the flag as the user
// typed it (e.g. "--dump-logits"), the path, and the reason (errno text). Pure functions of the file system.

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata::services {

// A pack directory that exists and holds a readable manifest. NOT_FOUND / INVALID_ARGUMENT otherwise.
absl::Status CheckPackDirFlag(absl::string_view flag, const std::string& dir);

// A regular file that exists and can be read.
absl::Status CheckInputFileFlag(absl::string_view flag, const std::string& path);

// A file that can be created or overwritten: its directory exists and is writable, and the path is not a
// directory. Creates nothing.
absl::Status CheckOutputFileFlag(absl::string_view flag, const std::string& path);

// Writes `bytes` to `path` (truncating it). UNAVAILABLE naming the file and the errno text otherwise.
absl::Status WriteResultFile(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace strata::services

#endif  // STRATA_SERVICES_PATH_FLAGS_H_
