#ifndef STRATA_PACKTOOL_INSPECT_H_
#define STRATA_PACKTOOL_INSPECT_H_

// Describes a pack directory or a GGUF file for a person (and for the Inspect RPC).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/pack/v1/manifest.pb.h"

namespace strata::packtool {

struct TensorSummary {
  std::string name;
  std::string type;
  std::vector<int64_t> shape;  // ggml order
  uint64_t bytes = 0;
};

struct Inspection {
  std::string kind;  // "pack" or "gguf"
  std::string architecture;
  pack::v1::Geometry geometry;  // of a GGUF: the blocks that run, without mtp_blocks
  // GGUFs only: the file's last blocks that are multi-token-prediction blocks (<arch>.nextn_predict_layers),
  // which Strata does not run and convert leaves out.
  int64_t mtp_blocks = 0;
  std::string scheme;  // packs only
  uint64_t total_bytes = 0;
  std::string tokenizer_model;
  uint64_t vocab_size = 0;
  std::vector<TensorSummary> tensors;  // a pack lists dense.gguf's tensors
  // Packs only: its routing profile in one line (tokens, prompts, skew), "none", or "invalid: why".
  std::string routing_profile;
};

absl::StatusOr<Inspection> Inspect(const std::string& path);

// Several lines of text: architecture, geometry, scheme, sizes, tokenizer, routing profile (packs), then one
// line per tensor.
std::string FormatInspection(const Inspection& inspection);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_INSPECT_H_
