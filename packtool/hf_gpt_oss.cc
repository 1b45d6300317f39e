#include "packtool/hf_gpt_oss.h"

#include <cstring>

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

}  // namespace strata::packtool
