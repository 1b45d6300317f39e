#include "kernels/format/expert_layout.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace strata::kernels {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

}  // namespace

absl::StatusOr<ExpertLayout> ComputeExpertLayout(Scheme scheme, int64_t n_embd, int64_t expert_ff) {
  if (n_embd <= 0 || expert_ff <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry: n_embd (", n_embd, ") and expert_ff (", expert_ff, ") must be positive"));
  }
  const int group = SchemeGroup(scheme);
  const std::string name(SchemeName(scheme));
  if (n_embd % group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("geometry: n_embd ", n_embd, " is not a multiple of ", group, ", the group of scheme ", name));
  }
  if (expert_ff % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("geometry: expert_ff ", expert_ff, " is not a multiple of ",
                                                   group, ", the group of scheme ", name));
  }
  ExpertLayout layout;
  layout.scheme = scheme;
  layout.n_embd = n_embd;
  layout.expert_ff = expert_ff;
  uint64_t offset = 0;
  for (int r = 0; r < 3; ++r) {
    if (absl::Status s = CheckRoleShape(scheme, layout.rows(r), layout.cols(r)); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("expert ", kRoleNames[r], " role: ", s.message()));
    }
    layout.role_offset[r] = offset;
    layout.role_bytes[r] = RoleBytes(scheme, layout.rows(r), layout.cols(r));
    offset = RoundUp(offset + layout.role_bytes[r], kRoleAlignment);
  }
  layout.blob_bytes = RoundUp(offset, kBlobAlignment);
  return layout;
}

}  // namespace strata::kernels
