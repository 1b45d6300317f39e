#include "packtool/hf_gpt_oss.h"

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/status_macros.h"

namespace strata::packtool {

void RepackMxfp4Rows(std::span<const uint8_t> blocks, std::span<const uint8_t> scales, int64_t n_expert,
                     int64_t src_rows, int64_t n_blocks, int64_t step, int64_t first, std::span<uint8_t> dst) {
  const int64_t rows = src_rows / step;
  uint8_t* out = dst.data();
  for (int64_t e = 0; e < n_expert; ++e) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t src_block = (e * src_rows + first + i * step) * n_blocks;
      for (int64_t b = 0; b < n_blocks; ++b, out += 17) {
        const uint8_t* in = blocks.data() + (src_block + b) * 16;
        out[0] = scales[static_cast<size_t>(src_block + b)];
        // Value v of the block: in[v / 2]'s low nibble for even v, high for odd.
        auto value = [in](int v) { return static_cast<uint8_t>((in[v / 2] >> (4 * (v % 2))) & 0x0F); };
        for (int j = 0; j < 16; ++j) out[1 + j] = static_cast<uint8_t>(value(j) | value(j + 16) << 4);
      }
    }
  }
}

void SelectExpertRows(std::span<const uint8_t> src, int64_t n_expert, int64_t src_rows, uint64_t row_bytes,
                      int64_t step, int64_t first, std::span<uint8_t> dst) {
  const int64_t rows = src_rows / step;
  for (int64_t e = 0; e < n_expert; ++e) {
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(dst.data() + (e * rows + i) * row_bytes, src.data() + (e * src_rows + first + i * step) * row_bytes,
                  row_bytes);
    }
  }
}

void TransposeExpertRows(std::span<const uint8_t> src, int64_t n_expert, int64_t k, int64_t src_rows,
                         uint64_t element, int64_t step, int64_t first, std::span<uint8_t> dst) {
  const int64_t rows = src_rows / step;
  for (int64_t e = 0; e < n_expert; ++e) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < k; ++c) {
        std::memcpy(dst.data() + ((e * rows + i) * k + c) * element,
                    src.data() + ((e * k + c) * src_rows + first + i * step) * element, element);
      }
    }
  }
}

absl::Status AddGptOssExpertTensor(const SynthTensor& st, const HfModelConfig& config, HfCheckpointTensors& tensors,
                                   const HfTensorAdder& add) {
  const SynthGeometry& g = config.geometry;
  const bool down = absl::StrContains(st.name, ".ffn_down_"), up = absl::StrContains(st.name, ".ffn_up_");
  const std::string fused = absl::StrCat("model.layers.", st.layer, ".mlp.experts.", down ? "down_proj" : "gate_up_proj");
  // Per expert: `src_rows` rows of `k` values in the checkpoint, every `step`-th from `first` this tensor's.
  const int64_t E = g.n_expert, k = down ? g.expert_ff : g.n_embd;
  const int64_t step = down ? 1 : 2, first = up ? 1 : 0, src_rows = step * (down ? g.n_embd : g.expert_ff);
  if (absl::EndsWith(st.name, ".bias")) {
    ASSIGN_OR_RETURN(const SafetensorsTensor* t, tensors.Take(fused + "_bias", std::vector<int64_t>{src_rows, E}));
    RETURN_IF_ERROR(tensors.RequireDtype(*t, /*u8=*/false));
    const HfTensorSource s{t, nullptr, *t->type};
    return add(st.name, gguf::GgmlType::kF32, st.ne, [s, E, src_rows, step, first](std::span<uint8_t> dst) {
      std::vector<uint8_t> selected(static_cast<size_t>(E * (src_rows / step)) * s.element_bytes());
      SelectExpertRows(s.tensor->data, E, src_rows, s.element_bytes(), step, first, selected);
      std::vector<float> values(selected.size() / s.element_bytes());
      RETURN_IF_ERROR(gguf::Dequantize(s.type, selected.data(), values.data(), static_cast<int64_t>(values.size())));
      std::memcpy(dst.data(), values.data(), values.size() * sizeof(float));
      return absl::OkStatus();
    });
  }
  if (config.mxfp4_experts) {
    if (k % 32 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(fused, ": MXFP4 rows of ", k, " values, expected a multiple of 32"));
    }
    const int64_t n_blocks = k / 32;
    ASSIGN_OR_RETURN(const SafetensorsTensor* blocks,
                     tensors.Take(fused + "_blocks", std::vector<int64_t>{16, n_blocks, src_rows, E}));
    ASSIGN_OR_RETURN(const SafetensorsTensor* scales,
                     tensors.Take(fused + "_scales", std::vector<int64_t>{n_blocks, src_rows, E}));
    RETURN_IF_ERROR(tensors.RequireDtype(*blocks, /*u8=*/true));
    RETURN_IF_ERROR(tensors.RequireDtype(*scales, /*u8=*/true));
    return add(st.name, gguf::GgmlType::kMXFP4, st.ne,
               [blocks, scales, E, src_rows, n_blocks, step, first](std::span<uint8_t> dst) {
                 RepackMxfp4Rows(blocks->data, scales->data, E, src_rows, n_blocks, step, first, dst);
                 return absl::OkStatus();
               });
  }
  ASSIGN_OR_RETURN(const SafetensorsTensor* t, tensors.Take(fused, std::vector<int64_t>{src_rows, k, E}));
  RETURN_IF_ERROR(tensors.RequireDtype(*t, /*u8=*/false));
  const HfTensorSource s{t, nullptr, *t->type};
  return add(st.name, s.type, st.ne, [s, E, k, src_rows, step, first](std::span<uint8_t> dst) {
    TransposeExpertRows(s.tensor->data, E, k, src_rows, s.element_bytes(), step, first, dst);
    return absl::OkStatus();
  });
}

}  // namespace strata::packtool
