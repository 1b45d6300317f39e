#ifndef STRATA_KERNELS_FORMAT_EXPERT_LAYOUT_H_
#define STRATA_KERNELS_FORMAT_EXPERT_LAYOUT_H_

// The blob of one routed expert (pack format v1): the gate (ff x n_embd), up (ff x n_embd) and down
// (n_embd x ff) roles of a SwiGLU expert in that order, each starting at a multiple of 256 bytes, the blob
// padded to a multiple of 4096 bytes (for O_DIRECT and DMA). The one place this is computed: packs, the
// converter, and the CPU and CUDA expert kernels all read it from here. Pure and thread-safe.

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/format/scheme.h"

namespace strata::kernels {

inline constexpr uint64_t kRoleAlignment = 256;   // each role's offset inside a blob
inline constexpr uint64_t kBlobAlignment = 4096;  // blob_bytes is a multiple

enum Role : int { kGate = 0, kUp = 1, kDown = 2 };
inline constexpr const char* kRoleNames[3] = {"gate", "up", "down"};

struct ExpertLayout {
  Scheme scheme = Scheme::kF16;
  int64_t n_embd = 0;
  int64_t expert_ff = 0;
  uint64_t role_offset[3] = {0, 0, 0};
  uint64_t role_bytes[3] = {0, 0, 0};
  uint64_t blob_bytes = 0;

  int64_t rows(int role) const { return role == kDown ? n_embd : expert_ff; }
  int64_t cols(int role) const { return role == kDown ? expert_ff : n_embd; }
  // What one forward pass of the expert reads: the three roles, without the padding.
  uint64_t weight_bytes() const { return role_bytes[0] + role_bytes[1] + role_bytes[2]; }
};

// The layout of an expert of n_embd x expert_ff in `scheme`. INVALID_ARGUMENT naming n_embd / expert_ff
// when they are not positive or the scheme's shape rules (kernels/format/scheme.h) refuse them.
absl::StatusOr<ExpertLayout> ComputeExpertLayout(Scheme scheme, int64_t n_embd, int64_t expert_ff);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_FORMAT_EXPERT_LAYOUT_H_
