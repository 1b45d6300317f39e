#ifndef STRATA_ENGINE_PACK_ROUTING_PROFILE_H_
#define STRATA_ENGINE_PACK_ROUTING_PROFILE_H_

// A pack's routing profile: how often the router picked each expert of each MoE layer over the tokens of
// some prompts, written by `strata-pack profile` into <pack>/routing_profile.bin and read by Pack::Open.
// The VRAM expert cache starts warm from it (the hottest experts first). Optional: a pack without one is
// complete; a pack with a malformed one is refused.
//
// The file, version 1, little-endian:
//   offset 0   char[8]  magic "STRATAPF"
//          8   u32      version (1)
//         12   u32      n_moe_layers   }
//         16   u32      n_expert       } must equal the manifest's geometry
//         20   u32      n_expert_used  }
//         24   u64      tokens         tokens profiled (each routed through every MoE layer)
//         32   u64      prompts        prompts the tokens came from
//         40   u64      counts[n_moe_layers x n_expert], index moe_layer * n_expert + expert (the blob index)
//   then       u64      xxh3-64 of every byte before it
// Each layer's counts sum to tokens x n_expert_used (the router picks that many experts a token).
// Pure functions; thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::pack {

inline constexpr char kRoutingProfileFile[] = "routing_profile.bin";
inline constexpr uint32_t kRoutingProfileVersion = 1;
inline constexpr char kRoutingProfileMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'P', 'F'};
// Bytes of a profile other than its counts: the header and the checksum.
inline constexpr uint64_t kRoutingProfileOverhead = 48;

struct RoutingProfile {
  uint32_t n_moe_layers = 0;
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;
  uint64_t tokens = 0;
  uint64_t prompts = 0;
  std::vector<uint64_t> counts;  // n_moe_layers x n_expert, by blob index

  bool operator==(const RoutingProfile&) const = default;
};

// An empty profile (all counts 0) for the manifest's geometry.
RoutingProfile EmptyRoutingProfile(const v1::Manifest& manifest);

// Whether `profile` fits the manifest's geometry (n_moe_layers, n_expert, n_expert_used, one count per blob)
// and is consistent (tokens > 0, each layer's counts summing to tokens x n_expert_used). INVALID_ARGUMENT
// naming the field and both numbers otherwise.
absl::Status CheckRoutingProfile(const RoutingProfile& profile, const v1::Manifest& manifest);

// The file's bytes. The profile is not checked (WriteRoutingProfile does).
std::string SerializeRoutingProfile(const RoutingProfile& profile);

// Parses a file's bytes and checks them against the manifest (CheckRoutingProfile). Errors name the field:
// DATA_LOSS for a truncated file or a bad checksum, INVALID_ARGUMENT for the rest. Messages do not name the
// file: the caller does.
absl::StatusOr<RoutingProfile> ParseRoutingProfile(std::string_view bytes, const v1::Manifest& manifest);

// <pack_dir>/routing_profile.bin, parsed and checked: nullopt when the pack has none; errors as
// ParseRoutingProfile (or the read's), prefixed with the file's path.
absl::StatusOr<std::optional<RoutingProfile>> ReadRoutingProfile(const std::string& pack_dir,
                                                                 const v1::Manifest& manifest);

// Checks `profile` against the manifest, then writes it as <pack_dir>/routing_profile.bin atomically: into
// routing_profile.bin.partial, flushed to disk, then renamed over the old profile, if any. On error the
// pack keeps its previous profile (or none) and no partial file is left behind.
absl::Status WriteRoutingProfile(const RoutingProfile& profile, const v1::Manifest& manifest,
                                 const std::string& pack_dir);

}  // namespace strata::pack

#endif  // STRATA_ENGINE_PACK_ROUTING_PROFILE_H_
