#include "services/data_root.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;

// As many symlinks as one resolution may follow (Linux's MAXSYMLINKS).
constexpr int kMaxSymlinks = 40;

// Pushes the components of `path` onto `pending` so that the first component is popped first.
void PushComponents(const fs::path& path, std::vector<std::string>* pending) {
  std::vector<std::string> parts;
  for (const fs::path& part : path.relative_path()) parts.push_back(part.string());
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) pending->push_back(*it);
}

// Resolves the absolute `path` like realpath(3), except that a component that does not exist is kept as it
// is (it cannot be a symlink) and a dangling symlink is followed to where it points. Returns an empty path
// when there are too many symlinks.
fs::path ResolveAbsolute(const fs::path& path) {
  std::vector<std::string> pending;
  PushComponents(path, &pending);
  fs::path current = "/";
  int links = 0;
  while (!pending.empty()) {
    const std::string part = std::move(pending.back());
    pending.pop_back();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      current = current.parent_path();
      continue;
    }
    fs::path next = current / part;
    std::error_code ec;
    const fs::file_status status = fs::symlink_status(next, ec);
    if (ec || !fs::exists(status) || !fs::is_symlink(status)) {
      // A missing component, or one below a file: kept lexically; whatever later opens it fails there.
      current = std::move(next);
      continue;
    }
    if (++links > kMaxSymlinks) return fs::path();
    const fs::path target = fs::read_symlink(next, ec);
    if (ec) return fs::path();
    if (target.is_absolute()) current = "/";
    PushComponents(target, &pending);
  }
  return current;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataRoot>> DataRoot::Create(const std::string& root) {
  if (root.empty()) return absl::InvalidArgumentError("data root: is empty; expected a directory");
  std::error_code ec;
  const fs::path canonical = fs::canonical(fs::absolute(root, ec), ec);
  if (ec) return absl::NotFoundError(absl::StrCat("data root '", root, "': ", ec.message()));
  if (!fs::is_directory(canonical, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("data root '", root, "': is not a directory"));
  }
  return std::unique_ptr<DataRoot>(new DataRoot(canonical.string()));
}

bool DataRoot::Contains(const std::string& resolved) const {
  if (root_ == "/") return true;
  if (resolved.size() < root_.size() || resolved.compare(0, root_.size(), root_) != 0) return false;
  return resolved.size() == root_.size() || resolved[root_.size()] == '/';
}

absl::StatusOr<std::string> DataRoot::Resolve(std::string_view request_path_view, std::string_view field_view) const {
  // Abseil's string_view is not std::string_view in this build.
  const std::string request_path(request_path_view);
  const std::string field(field_view);
  if (request_path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": is empty; expected a path"));
  if (request_path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": contains a NUL character"));
  }
  fs::path requested(request_path);
  if (requested.is_relative()) requested = fs::path(root_) / requested;
  const fs::path resolved = ResolveAbsolute(requested);
  if (resolved.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", request_path, "' has too many symlinks"));
  }
  std::string result = resolved.string();
  if (!Contains(result)) {
    return absl::PermissionDeniedError(absl::StrCat(field, ": '", request_path, "' is outside the data root"));
  }
  return result;
}

absl::Status DataRoot::Relative(const absl::Status& status) const {
  if (status.ok() || root_ == "/") return status;
  std::string message(status.message());
  // A path is the root's when it starts there (not "/backup/srv/root" for the root "/srv/root") and goes
  // on with a '/' or ends (not "/srv/root2").
  const auto is_boundary = [&message](size_t i) {
    return i == message.size() || std::string_view(" :,;'\"()").find(message[i]) != std::string_view::npos;
  };
  for (size_t at = message.find(root_); at != std::string::npos; at = message.find(root_, at + 1)) {
    if (at > 0 && !is_boundary(at - 1)) continue;
    const size_t end = at + root_.size();
    if (end < message.size() && message[end] == '/') {
      message.erase(at, root_.size() + 1);
    } else if (is_boundary(end)) {
      message.replace(at, root_.size(), ".");
    }
  }
  return absl::Status(status.code(), message);
}

}  // namespace strata::services
