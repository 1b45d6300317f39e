#ifndef STRATA_SERVICES_DATA_ROOT_H_
#define STRATA_SERVICES_DATA_ROOT_H_

// The path policy of the services: every path in a request must resolve inside one configured directory.
//
// Resolve follows every symlink on the way, including a dangling last one, and keeps the part that does not
// exist yet lexically, so a path that would be created (an output directory) is judged by where it would
// land. A path that leaves the root is PERMISSION_DENIED; the caller then touches nothing. The check is made
// at request time: a symlink swapped inside the root afterwards is not seen (whoever can write the root is
// trusted). Immutable after Create; any thread may call Resolve.

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata::services {

class DataRoot {
 public:
  // `root` must be an existing directory; it is made absolute and canonical.
  static absl::StatusOr<std::unique_ptr<DataRoot>> Create(const std::string& root);

  // Returns the absolute, symlink-free path `request_path` names; a relative path is taken from the root.
  // Errors name `field` (the request field): INVALID_ARGUMENT when empty or malformed, PERMISSION_DENIED
  // when it resolves outside the root.
  absl::StatusOr<std::string> Resolve(std::string_view request_path, std::string_view field) const;

  const std::string& path() const { return root_; }

  // `status` with every path inside the root in its message written relative to the root, as clients name
  // them: what the library reports about a resolved path must not reveal where the root lies.
  absl::Status Relative(const absl::Status& status) const;

 private:
  explicit DataRoot(std::string root) : root_(std::move(root)) {}

  bool Contains(const std::string& resolved) const;

  std::string root_;  // canonical, no trailing slash (except "/")
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_DATA_ROOT_H_
