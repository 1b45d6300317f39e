#include "services/path_flags.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/pack/pack_format.h"

namespace strata::services {
namespace {

absl::Status FlagError(absl::StatusCode code, absl::string_view flag, const std::string& path, absl::string_view why) {
  return absl::Status(code, absl::StrCat(flag, " ", path, ": ", why));
}

}  // namespace

absl::Status CheckPackDirFlag(absl::string_view flag, const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return FlagError(absl::StatusCode::kNotFound, flag, dir, std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) {
    return FlagError(absl::StatusCode::kInvalidArgument, flag, dir, "not a directory (a pack is a directory)");
  }
  const std::string manifest = absl::StrCat(dir, "/", pack::kManifestFile);
  if (access(manifest.c_str(), R_OK) != 0) {
    return FlagError(absl::StatusCode::kInvalidArgument, flag, dir,
                     absl::StrCat("not a pack: ", pack::kManifestFile, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckInputFileFlag(absl::string_view flag, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return FlagError(absl::StatusCode::kNotFound, flag, path, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return FlagError(absl::StatusCode::kInvalidArgument, flag, path, "is a directory, not a file");
  if (access(path.c_str(), R_OK) != 0) {
    return FlagError(absl::StatusCode::kPermissionDenied, flag, path, std::strerror(errno));
  }
  return absl::OkStatus();
}

absl::Status CheckOutputFileFlag(absl::string_view flag, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": no file given"));
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return FlagError(absl::StatusCode::kInvalidArgument, flag, path, "is a directory, not a file");
    }
    if (access(path.c_str(), W_OK) != 0) {
      return FlagError(absl::StatusCode::kPermissionDenied, flag, path, std::strerror(errno));
    }
    return absl::OkStatus();
  }
  std::string parent = std::filesystem::path(path).parent_path().string();
  if (parent.empty()) parent = ".";
  if (stat(parent.c_str(), &st) != 0) {
    return FlagError(absl::StatusCode::kNotFound, flag, path,
                     absl::StrCat("directory ", parent, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return FlagError(absl::StatusCode::kInvalidArgument, flag, path, absl::StrCat(parent, " is not a directory"));
  }
  if (access(parent.c_str(), W_OK | X_OK) != 0) {
    return FlagError(absl::StatusCode::kPermissionDenied, flag, path,
                     absl::StrCat("directory ", parent, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WriteResultFile(const std::string& path, std::span<const uint8_t> bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace strata::services
