#include "engine/pack/pack.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "xxhash.h"
#include "engine/status_macros.h"

namespace strata::pack {

absl::StatusOr<std::unique_ptr<Pack>> Pack::Open(const std::string& dir, const PackOpenOptions& options) {
  std::unique_ptr<Pack> p(new Pack());
  p->dir_ = dir;
  ASSIGN_OR_RETURN(p->manifest_, ReadManifest(dir));
  if (absl::Status s = CheckManifest(p->manifest_); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", kManifestFile, ": ", s.message()));
  }
  ASSIGN_OR_RETURN(p->layout_, LayoutFromManifest(p->manifest_));
  std::error_code ec;
  const std::string experts = p->experts_path();
  const uint64_t size = std::filesystem::file_size(experts, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(experts, ": ", ec.message()));
  if (size != p->manifest_.experts_bytes()) {
    const v1::Geometry& g = p->manifest_.geometry();
    return absl::DataLossError(absl::StrCat(experts, ": size ", size,
                                            " bytes, expected n_moe_layers x n_expert x blob_bytes = ", g.n_moe_layers(),
                                            " x ", g.n_expert(), " x ", p->manifest_.blob_bytes(), " = ",
                                            p->manifest_.experts_bytes()));
  }
  const std::string dense = absl::StrCat(dir, "/", kDenseFile);
  ASSIGN_OR_RETURN(p->dense_, gguf::GgufFile::Open(dense));
  if (absl::Status s = CheckDenseBytes(p->manifest_, p->dense_->file_size()); !s.ok()) {
    return WithContext(s, dense);
  }
  p->blob_hashes_.reserve(p->manifest_.blob_xxh3_size());
  for (const std::string& h : p->manifest_.blob_xxh3()) p->blob_hashes_.push_back(*ParseHashHex(h));
  if (!options.ignore_routing_profile) {
    absl::StatusOr<std::optional<RoutingProfile>> profile = ReadRoutingProfile(dir, p->manifest_);
    if (!profile.ok()) {
      return absl::Status(profile.status().code(),
                          absl::StrCat(profile.status().message(),
                                       " (strata-pack profile writes a new one; or delete the file)"));
    }
    p->routing_profile_ = *std::move(profile);
  }
  return p;
}

std::string Pack::experts_path() const { return absl::StrCat(dir_, "/", kExpertsFile); }

absl::Status Pack::CheckBlob(uint64_t index, const uint8_t* blob) const {
  const uint64_t got = XXH3_64bits(blob, manifest_.blob_bytes());
  if (got == blob_hashes_[index]) return absl::OkStatus();
  const uint64_t n_expert = manifest_.geometry().n_expert();
  return absl::DataLossError(absl::StrCat(experts_path(), ": blob ", index, " (moe layer ", index / n_expert,
                                          ", expert ", index % n_expert, ") has checksum ", HashHex(got),
                                          ", manifest says ", HashHex(blob_hashes_[index])));
}

}  // namespace strata::pack
