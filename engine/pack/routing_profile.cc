#include "engine/pack/routing_profile.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/pack/pack_format.h"
#include "engine/status_macros.h"
#include "xxhash.h"

namespace strata::pack {
namespace {

static_assert(std::endian::native == std::endian::little, "the routing profile is read and written as little-endian");

constexpr size_t kHeaderBytes = 40;  // before the counts

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
T Get(std::string_view bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(value));
  return value;
}

absl::Status GeometryMismatch(const char* field, uint64_t file_value, uint64_t manifest_value) {
  return absl::InvalidArgumentError(absl::StrCat("field '", field, "': ", file_value, ", the pack's manifest says ",
                                                 manifest_value, " (a profile of another model?)"));
}

// write(2) all of `data`, retrying short writes.
bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

RoutingProfile EmptyRoutingProfile(const v1::Manifest& manifest) {
  const v1::Geometry& g = manifest.geometry();
  RoutingProfile p;
  p.n_moe_layers = g.n_moe_layers();
  p.n_expert = g.n_expert();
  p.n_expert_used = g.n_expert_used();
  p.counts.assign(static_cast<size_t>(g.n_moe_layers()) * g.n_expert(), 0);
  return p;
}

absl::Status CheckRoutingProfile(const RoutingProfile& profile, const v1::Manifest& manifest) {
  const v1::Geometry& g = manifest.geometry();
  if (profile.n_moe_layers != g.n_moe_layers()) {
    return GeometryMismatch("n_moe_layers", profile.n_moe_layers, g.n_moe_layers());
  }
  if (profile.n_expert != g.n_expert()) return GeometryMismatch("n_expert", profile.n_expert, g.n_expert());
  if (profile.n_expert_used != g.n_expert_used()) {
    return GeometryMismatch("n_expert_used", profile.n_expert_used, g.n_expert_used());
  }
  const uint64_t n_counts = uint64_t{profile.n_moe_layers} * profile.n_expert;
  if (profile.counts.size() != n_counts) {
    return absl::InvalidArgumentError(absl::StrCat("field 'counts': ", profile.counts.size(),
                                                   " counts, expected n_moe_layers x n_expert = ", n_counts));
  }
  if (profile.tokens == 0) return absl::InvalidArgumentError("field 'tokens' is 0: the profile counts nothing");
  // 128 bits: neither the expected sum nor a layer's sum can overflow.
  const unsigned __int128 expected = static_cast<unsigned __int128>(profile.tokens) * profile.n_expert_used;
  for (uint64_t layer = 0; layer < profile.n_moe_layers; ++layer) {
    unsigned __int128 sum = 0;
    for (uint64_t e = 0; e < profile.n_expert; ++e) sum += profile.counts[layer * profile.n_expert + e];
    if (sum != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'counts' of moe layer ", layer, ": they sum to ", static_cast<uint64_t>(sum),
          sum >> 64 ? " (mod 2^64)" : "", ", expected tokens x n_expert_used = ", profile.tokens, " x ",
          profile.n_expert_used));
    }
  }
  return absl::OkStatus();
}

std::string SerializeRoutingProfile(const RoutingProfile& profile) {
  std::string out;
  out.reserve(kRoutingProfileOverhead + profile.counts.size() * sizeof(uint64_t));
  out.append(kRoutingProfileMagic, sizeof(kRoutingProfileMagic));
  Put(&out, kRoutingProfileVersion);
  Put(&out, profile.n_moe_layers);
  Put(&out, profile.n_expert);
  Put(&out, profile.n_expert_used);
  Put(&out, profile.tokens);
  Put(&out, profile.prompts);
  for (uint64_t c : profile.counts) Put(&out, c);
  Put(&out, static_cast<uint64_t>(XXH3_64bits(out.data(), out.size())));
  return out;
}

absl::StatusOr<RoutingProfile> ParseRoutingProfile(std::string_view bytes, const v1::Manifest& manifest) {
  if (bytes.size() < kRoutingProfileOverhead) {
    return absl::DataLossError(absl::StrCat("truncated: ", bytes.size(), " bytes, a routing profile has at least ",
                                            kRoutingProfileOverhead, " (header and checksum)"));
  }
  if (std::memcmp(bytes.data(), kRoutingProfileMagic, sizeof(kRoutingProfileMagic)) != 0) {
    return absl::InvalidArgumentError("field 'magic': not a Strata routing profile (expected \"STRATAPF\")");
  }
  if (const uint32_t version = Get<uint32_t>(bytes, 8); version != kRoutingProfileVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'version': ", version, ", this build reads version ", kRoutingProfileVersion));
  }
  RoutingProfile p;
  p.n_moe_layers = Get<uint32_t>(bytes, 12);
  p.n_expert = Get<uint32_t>(bytes, 16);
  p.n_expert_used = Get<uint32_t>(bytes, 20);
  p.tokens = Get<uint64_t>(bytes, 24);
  p.prompts = Get<uint64_t>(bytes, 32);
  // Both factors are 32-bit, so the count of counts fits; its bytes might not, hence the division.
  const uint64_t n_counts = uint64_t{p.n_moe_layers} * p.n_expert;
  const uint64_t counts_room = (bytes.size() - kRoutingProfileOverhead) / sizeof(uint64_t);
  if (n_counts != counts_room || (bytes.size() - kRoutingProfileOverhead) % sizeof(uint64_t) != 0) {
    const unsigned __int128 expected =
        kRoutingProfileOverhead + static_cast<unsigned __int128>(n_counts) * sizeof(uint64_t);
    return absl::DataLossError(absl::StrCat(n_counts > counts_room ? "truncated: " : "size: ", bytes.size(),
                                            " bytes, expected 48 + 8 x n_moe_layers x n_expert = 48 + 8 x ",
                                            p.n_moe_layers, " x ", p.n_expert, " = ", static_cast<uint64_t>(expected)));
  }
  const size_t body = bytes.size() - sizeof(uint64_t);
  const uint64_t stored = Get<uint64_t>(bytes, body);
  if (const uint64_t got = XXH3_64bits(bytes.data(), body); got != stored) {
    return absl::DataLossError(
        absl::StrCat("field 'xxh3': the contents hash to ", HashHex(got), ", the file says ", HashHex(stored)));
  }
  p.counts.resize(n_counts);
  if (n_counts > 0) std::memcpy(p.counts.data(), bytes.data() + kHeaderBytes, n_counts * sizeof(uint64_t));
  if (absl::Status s = CheckRoutingProfile(p, manifest); !s.ok()) return s;
  return p;
}

absl::StatusOr<std::optional<RoutingProfile>> ReadRoutingProfile(const std::string& pack_dir,
                                                                 const v1::Manifest& manifest) {
  const std::string path = absl::StrCat(pack_dir, "/", kRoutingProfileFile);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (ec) return absl::UnavailableError(absl::StrCat(path, ": ", ec.message()));
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  absl::StatusOr<RoutingProfile> profile = ParseRoutingProfile(bytes.view(), manifest);
  if (!profile.ok()) {
    return WithContext(profile.status(), path);
  }
  return std::optional<RoutingProfile>(*std::move(profile));
}

absl::Status WriteRoutingProfile(const RoutingProfile& profile, const v1::Manifest& manifest,
                                 const std::string& pack_dir) {
  const std::string path = absl::StrCat(pack_dir, "/", kRoutingProfileFile);
  if (absl::Status s = CheckRoutingProfile(profile, manifest); !s.ok()) {
    return WithContext(s, absl::StrCat(path, ": not written"));
  }
  const std::string partial = path + ".partial";
  const std::string bytes = SerializeRoutingProfile(profile);
  const int fd = open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(partial, ": cannot create: ", std::strerror(errno)));
  const bool written = WriteAll(fd, bytes) && fsync(fd) == 0;
  const int write_errno = errno;
  const bool closed = close(fd) == 0;
  if (!written || !closed) {
    std::remove(partial.c_str());
    return absl::UnavailableError(
        absl::StrCat(partial, ": write failed: ", std::strerror(written ? errno : write_errno)));
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(partial.c_str());
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot rename ", partial, " to it: ", std::strerror(rename_errno)));
  }
  // The rename is durable once the directory is flushed too.
  if (const int dir = open(pack_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    fsync(dir);
    close(dir);
  }
  return absl::OkStatus();
}

}  // namespace strata::pack
