#ifndef STRATA_ENGINE_PACK_PACK_FORMAT_H_
#define STRATA_ENGINE_PACK_PACK_FORMAT_H_

// The pack format (v1): file names, blob layout, manifest reading, writing and consistency checks.
// Pure functions; thread-safe.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/format/expert_layout.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::pack {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr char kExpertsFile[] = "experts.bin";
inline constexpr char kDenseFile[] = "dense.gguf";
using kernels::kBlobAlignment;
using kernels::kRoleAlignment;
using kernels::kRoleNames;

// Where gate, up and down lie in a blob: defined once, in kernels/format/expert_layout.h.
using BlobLayout = kernels::ExpertLayout;
inline absl::StatusOr<BlobLayout> ComputeBlobLayout(kernels::Scheme scheme, int64_t n_embd, int64_t expert_ff) {
  return kernels::ComputeExpertLayout(scheme, n_embd, expert_ff);
}

// Writes the layout's roles and blob_bytes into `manifest`.
void SetManifestLayout(const BlobLayout& layout, v1::Manifest* manifest);

// Reads the layout back from a manifest and checks that it is exactly what ComputeBlobLayout gives for the
// manifest's scheme and geometry (a pack from another tool version with another layout is refused).
absl::StatusOr<BlobLayout> LayoutFromManifest(const v1::Manifest& manifest);

// Checks a manifest on its own: version, scheme, geometry (non-zero, n_expert_used <= n_expert,
// moe_layers consistent), layout, experts_bytes == n_moe_layers * n_expert * blob_bytes, one checksum per
// blob in hex. Errors name the field and both numbers.
absl::Status CheckManifest(const v1::Manifest& manifest);

// dense.gguf's size against the manifest's dense_bytes (0: not recorded): DATA_LOSS naming both.
absl::Status CheckDenseBytes(const v1::Manifest& manifest, uint64_t size);

// manifest.json <-> message. Parse errors name the file; the result is not checked (call CheckManifest).
absl::StatusOr<v1::Manifest> ReadManifest(const std::string& pack_dir);
absl::Status WriteManifest(const v1::Manifest& manifest, const std::string& pack_dir);

// xxh3-64 as 16 lower-case hex digits, and back.
std::string HashHex(uint64_t hash);
absl::StatusOr<uint64_t> ParseHashHex(std::string_view hex);

// Index of a blob in experts.bin.
inline uint64_t BlobIndex(const v1::Manifest& m, uint64_t moe_layer, uint64_t expert) {
  return moe_layer * m.geometry().n_expert() + expert;
}

}  // namespace strata::pack

#endif  // STRATA_ENGINE_PACK_PACK_FORMAT_H_
