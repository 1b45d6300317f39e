#include "services/gguf_pack_cache.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"
#include "packtool/validate.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;
constexpr char kStampFile[] = "source.stamp";

// "size <bytes> mtime <ns>" of the GGUF: what a reuse compares.
absl::StatusOr<std::string> SourceStamp(const std::string& gguf_path) {
  struct stat st;
  if (stat(gguf_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("--model ", gguf_path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat("--model ", gguf_path, ": not a file"));
  const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return absl::StrCat("size ", st.st_size, " mtime ", mtime_ns, "\n");
}

std::string ReadStamp(const std::string& dir) {
  std::ifstream in(absl::StrCat(dir, "/", kStampFile));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string PackCacheDir(const std::string& gguf_path) { return gguf_path + ".strata-pack"; }

absl::StatusOr<PackCacheResult> PackForGguf(const std::string& gguf_path, const packtool::ConvertProgressFn& progress,
                                            const std::atomic<bool>* cancel) {
  ASSIGN_OR_RETURN(const std::string stamp, SourceStamp(gguf_path));
  PackCacheResult result;
  result.pack_dir = PackCacheDir(gguf_path);
  std::error_code ec;
  if (fs::is_directory(result.pack_dir, ec) && ReadStamp(result.pack_dir) == stamp) {
    packtool::ValidateOptions quick;
    quick.quick = true;
    quick.cancel = cancel;
    absl::StatusOr<packtool::ValidationReport> report = packtool::ValidatePack(result.pack_dir, quick);
    if (report.ok() && report->ok()) {
      result.reused = true;
      return result;
    }
  }
  // Absent, stale or cut short: convert again from nothing.
  fs::remove_all(result.pack_dir, ec);
  fs::remove_all(result.pack_dir + ".partial", ec);
  packtool::ConvertOptions convert;
  convert.input = gguf_path;
  convert.output_dir = result.pack_dir;
  RETURN_IF_ERROR(packtool::ConvertGguf(convert, progress, cancel).status());
  packtool::ValidateOptions full;
  full.cancel = cancel;
  ASSIGN_OR_RETURN(const packtool::ValidationReport report, packtool::ValidatePack(result.pack_dir, full));
  if (!report.ok()) {
    const packtool::ValidationProblem& first = report.problems.front();
    return absl::DataLossError(absl::StrCat(result.pack_dir, ": the converted pack does not validate: ", first.file,
                                            ": ", first.message));
  }
  // Written last: only a complete, validated pack carries the stamp.
  const std::string stamp_path = absl::StrCat(result.pack_dir, "/", kStampFile);
  std::ofstream out(stamp_path, std::ios::trunc);
  out << stamp;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", stamp_path, ": ", std::strerror(errno)));
  return result;
}

}  // namespace strata::services
