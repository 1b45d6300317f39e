#include "kernels/format/scheme.h"

#include "absl/strings/str_cat.h"
#include "kernels/format/role_layout.h"

namespace strata::kernels {
namespace {

// This Abseil's AlphaNum takes absl::string_view, which is not std::string_view here.
absl::string_view Sv(std::string_view v) { return absl::string_view(v.data(), v.size()); }

}  // namespace

absl::StatusOr<Scheme> ParseScheme(std::string_view name) {
  if (name == "f16") return Scheme::kF16;
  if (name == "s8") return Scheme::kS8;
  if (name == "s4") return Scheme::kS4;
  if (name == "s2") return Scheme::kS2;
  if (name == "mxfp4") return Scheme::kMxfp4;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown expert scheme '", Sv(name), "': expected one of f16, s8, s4, s2, mxfp4"));
}

std::string_view SchemeName(Scheme scheme) {
  switch (scheme) {
    case Scheme::kF16:
      return "f16";
    case Scheme::kS8:
      return "s8";
    case Scheme::kS4:
      return "s4";
    case Scheme::kS2:
      return "s2";
    case Scheme::kMxfp4:
      return "mxfp4";
  }
  return "unknown";
}

int SchemeGroup(Scheme scheme) {
  return scheme == Scheme::kF16 ? 1 : static_cast<int>(layout::Group(scheme));
}

double SchemeBitsPerWeight(Scheme scheme) {
  switch (scheme) {
    case Scheme::kF16:
      return 16.0;
    case Scheme::kS8:
      return 8.5;
    case Scheme::kS4:
      return 5.0;
    case Scheme::kS2:
      return 2.25;
    case Scheme::kMxfp4:
      return 4.25;
  }
  return 0.0;
}

double SchemeErrorBound(Scheme scheme) {
  switch (scheme) {
    case Scheme::kF16:
      return 5e-4;
    case Scheme::kS8:
      return 0.0075;
    case Scheme::kS4:
      return 0.085;
    case Scheme::kS2:
      return 0.37;
    case Scheme::kMxfp4:
      return 0.14;
  }
  return 0.0;
}

absl::Status CheckRoleShape(Scheme scheme, int64_t rows, int64_t cols) {
  const int64_t col_multiple = scheme == Scheme::kS2 ? 64 : 32;
  if (rows <= 0 || rows % kRowTile != 0 || rows > kMaxRoleDim) {
    return absl::InvalidArgumentError(absl::StrCat("role of scheme ", Sv(SchemeName(scheme)), " has rows ", rows,
                                                   ": expected a positive multiple of ", kRowTile,
                                                   " at most ", kMaxRoleDim));
  }
  if (cols <= 0 || cols % col_multiple != 0 || cols > kMaxRoleDim) {
    return absl::InvalidArgumentError(absl::StrCat("role of scheme ", Sv(SchemeName(scheme)), " has cols ", cols,
                                                   ": expected a positive multiple of ", col_multiple,
                                                   " at most ", kMaxRoleDim));
  }
  return absl::OkStatus();
}

uint64_t RoleBytes(Scheme scheme, int64_t rows, int64_t cols) {
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  switch (scheme) {
    case Scheme::kF16:
      return 2 * n;
    case Scheme::kS8:
      return n + n / 32 * 2;
    case Scheme::kS4:
      return n / 2 + n / 32 * 4;
    case Scheme::kS2:
      return n / 4 + n / 64 * 2;
    case Scheme::kMxfp4:
      return n / 2 + n / 32;
  }
  return 0;
}

}  // namespace strata::kernels
