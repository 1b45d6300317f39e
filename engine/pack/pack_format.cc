#include "engine/pack/pack_format.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace strata::pack {
void SetManifestLayout(const BlobLayout& layout, v1::Manifest* manifest) {
  manifest->set_scheme(std::string(kernels::SchemeName(layout.scheme)));
  manifest->clear_roles();
  const int64_t rows[3] = {layout.expert_ff, layout.expert_ff, layout.n_embd};
  const int64_t cols[3] = {layout.n_embd, layout.n_embd, layout.expert_ff};
  for (int r = 0; r < 3; ++r) {
    v1::RoleLayout* role = manifest->add_roles();
    role->set_name(std::string(kRoleNames[r]));
    role->set_offset(layout.role_offset[r]);
    role->set_rows(static_cast<uint32_t>(rows[r]));
    role->set_cols(static_cast<uint32_t>(cols[r]));
    role->set_group(static_cast<uint32_t>(kernels::SchemeGroup(layout.scheme)));
    role->set_bytes(layout.role_bytes[r]);
  }
  manifest->set_blob_bytes(layout.blob_bytes);
}

absl::StatusOr<BlobLayout> LayoutFromManifest(const v1::Manifest& manifest) {
  auto scheme = kernels::ParseScheme(manifest.scheme());
  if (!scheme.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest field 'scheme': unknown scheme '", manifest.scheme(), "' (expected f16, s8, s4, s2 or mxfp4)"));
  }
  const v1::Geometry& g = manifest.geometry();
  ASSIGN_OR_RETURN(BlobLayout expected, ComputeBlobLayout(*scheme, g.n_embd(), g.expert_ff()));
  if (manifest.roles_size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest field 'roles': ", manifest.roles_size(), " roles, expected 3 (gate, up, down)"));
  }
  const int64_t rows[3] = {expected.expert_ff, expected.expert_ff, expected.n_embd};
  const int64_t cols[3] = {expected.n_embd, expected.n_embd, expected.expert_ff};
  for (int r = 0; r < 3; ++r) {
    const v1::RoleLayout& role = manifest.roles(r);
    const std::string where = absl::StrCat("manifest field 'roles[", r, "]'");
    if (role.name() != kRoleNames[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": name '", role.name(), "', expected '", kRoleNames[r], "'"));
    }
    if (role.offset() != expected.role_offset[r] || role.bytes() != expected.role_bytes[r] ||
        role.rows() != rows[r] || role.cols() != cols[r] ||
        role.group() != static_cast<uint32_t>(kernels::SchemeGroup(*scheme))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s (%s): offset %d, bytes %d, rows %d, cols %d, group %d; expected offset %d, bytes %d, rows %d, "
          "cols %d, group %d for scheme %s",
          where, role.name(), role.offset(), role.bytes(), role.rows(), role.cols(), role.group(),
          expected.role_offset[r], expected.role_bytes[r], rows[r], cols[r], kernels::SchemeGroup(*scheme),
          manifest.scheme()));
    }
  }
  if (manifest.blob_bytes() != expected.blob_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("manifest field 'blob_bytes': ", manifest.blob_bytes(),
                                                   ", expected ", expected.blob_bytes, " for scheme ",
                                                   manifest.scheme(), " at n_embd ", g.n_embd(), ", expert_ff ",
                                                   g.expert_ff()));
  }
  return expected;
}

absl::Status CheckDenseBytes(const v1::Manifest& manifest, uint64_t size) {
  if (manifest.dense_bytes() == 0 || size == manifest.dense_bytes()) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("size ", size, " bytes, the manifest says ", manifest.dense_bytes(), " (dense_bytes)"));
}

absl::Status CheckManifest(const v1::Manifest& manifest) {
  if (manifest.format_version() != kFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("manifest field 'format_version': ", manifest.format_version(),
                                                   ", this build reads version ", kFormatVersion));
  }
  if (manifest.architecture().empty()) {
    return absl::InvalidArgumentError("manifest field 'architecture' is empty");
  }
  const v1::Geometry& g = manifest.geometry();
  const std::pair<const char*, uint32_t> positive[] = {
      {"n_layer", g.n_layer()},     {"n_moe_layers", g.n_moe_layers()}, {"n_expert", g.n_expert()},
      {"n_expert_used", g.n_expert_used()}, {"n_embd", g.n_embd()},      {"expert_ff", g.expert_ff()}};
  for (const auto& [name, value] : positive) {
    if (value == 0) return absl::InvalidArgumentError(absl::StrCat("manifest field 'geometry.", name, "' is 0"));
  }
  if (g.n_expert_used() > g.n_expert()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest field 'geometry.n_expert_used': ", g.n_expert_used(),
                                                   " exceeds n_expert ", g.n_expert()));
  }
  if (g.n_moe_layers() > g.n_layer()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest field 'geometry.n_moe_layers': ", g.n_moe_layers(),
                                                   " exceeds n_layer ", g.n_layer()));
  }
  if (static_cast<uint32_t>(g.moe_layers_size()) != g.n_moe_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest field 'geometry.moe_layers': ", g.moe_layers_size(),
                                                   " entries, expected n_moe_layers = ", g.n_moe_layers()));
  }
  for (int i = 0; i < g.moe_layers_size(); ++i) {
    if (g.moe_layers(i) >= g.n_layer() || (i > 0 && g.moe_layers(i) <= g.moe_layers(i - 1))) {
      return absl::InvalidArgumentError(absl::StrCat("manifest field 'geometry.moe_layers[", i, "]': ",
                                                     g.moe_layers(i), " is not an increasing block index below ",
                                                     g.n_layer()));
    }
  }
  ASSIGN_OR_RETURN(BlobLayout layout, LayoutFromManifest(manifest));
  const uint64_t n_blobs = static_cast<uint64_t>(g.n_moe_layers()) * g.n_expert();
  // n_blobs < 2^64 / blob_bytes is guaranteed: both factors are 32-bit and blob_bytes < 2^40 for any
  // geometry that passes ComputeBlobLayout with 32-bit n_embd and ff... but check rather than argue.
  if (layout.blob_bytes != 0 && n_blobs > UINT64_MAX / layout.blob_bytes) {
    return absl::InvalidArgumentError("manifest: n_moe_layers x n_expert x blob_bytes overflows 64 bits");
  }
  const uint64_t expected_bytes = n_blobs * layout.blob_bytes;
  if (manifest.experts_bytes() != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest field 'experts_bytes': ", manifest.experts_bytes(), ", expected n_moe_layers x n_expert x blob_bytes = ",
        g.n_moe_layers(), " x ", g.n_expert(), " x ", layout.blob_bytes, " = ", expected_bytes));
  }
  if (static_cast<uint64_t>(manifest.blob_xxh3_size()) != n_blobs) {
    return absl::InvalidArgumentError(absl::StrCat("manifest field 'blob_xxh3': ", manifest.blob_xxh3_size(),
                                                   " checksums, expected one per blob = ", n_blobs));
  }
  for (int i = 0; i < manifest.blob_xxh3_size(); ++i) {
    if (!ParseHashHex(manifest.blob_xxh3(i)).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("manifest field 'blob_xxh3[", i, "]': '", manifest.blob_xxh3(i),
                                                     "' is not 16 hex digits"));
    }
  }
  if (manifest.dense_file() != kDenseFile) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest field 'dense_file': '", manifest.dense_file(), "', expected '", kDenseFile, "'"));
  }
  if (!manifest.dense_xxh3().empty() && !ParseHashHex(manifest.dense_xxh3()).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest field 'dense_xxh3': '", manifest.dense_xxh3(), "' is not 16 hex digits"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Manifest> ReadManifest(const std::string& pack_dir) {
  const std::string path = absl::StrCat(pack_dir, "/", kManifestFile);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  v1::Manifest manifest;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(text.str(), &manifest, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a valid manifest: ", std::string(status.message().data(), status.message().size())));
  }
  return manifest;
}

absl::Status WriteManifest(const v1::Manifest& manifest, const std::string& pack_dir) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  const auto status = google::protobuf::util::MessageToJsonString(manifest, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("manifest to JSON: ", std::string(status.message().data(), status.message().size())));
  }
  const std::string path = absl::StrCat(pack_dir, "/", kManifestFile);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  const bool written = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) return absl::UnavailableError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

std::string HashHex(uint64_t hash) { return absl::StrFormat("%016x", hash); }

absl::StatusOr<uint64_t> ParseHashHex(std::string_view hex) {
  if (hex.size() != 16) return absl::InvalidArgumentError(absl::StrCat("'", std::string(hex), "' is not 16 hex digits"));
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("'", std::string(hex), "' is not 16 hex digits"));
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace strata::pack
