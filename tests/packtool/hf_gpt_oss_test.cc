#include "packtool/hf_gpt_oss.h"

#include <cmath>
#include <vector>

#include "engine/gguf/ggml_types.h"
#include "gtest/gtest.h"

namespace strata::packtool {
namespace {

// One expert of 4 rows of one block: rows 0 and 2 taken (step 2 from 0). Decoded by ggml's MXFP4 they must be
// the values OpenAI's reference (gpt_oss/torch/weights.py) gives the checkpoint's bytes: byte j's low nibble
// is value 2j, its high nibble value 2j + 1, each an FP4 (E2M1) of {0, 0.5, 1, 1.5, 2, 3, 4, 6} (bit 3 the
// sign) times 2^(scale - 127).
TEST(HfGptOssTest, RepackedMxfp4DecodesToTheReferencesValues) {
  const float kFp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  std::vector<uint8_t> blocks(4 * 16), scales = {127, 131, 120, 140};
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<uint8_t> repacked(2 * 17);
  RepackMxfp4Rows(blocks, scales, /*n_expert=*/1, /*src_rows=*/4, /*n_blocks=*/1, /*step=*/2, /*first=*/0, repacked);
  std::vector<float> decoded(64);
  ASSERT_TRUE(gguf::Dequantize(gguf::GgmlType::kMXFP4, repacked.data(), decoded.data(), 64).ok());
  for (int out_row = 0; out_row < 2; ++out_row) {
    const int row = 2 * out_row;
    for (int v = 0; v < 32; ++v) {
      const uint8_t byte = blocks[row * 16 + v / 2];
      const int nibble = v % 2 == 0 ? byte & 0x0F : byte >> 4;
      const float expected = std::ldexp(kFp4[nibble], scales[row] - 127);
      EXPECT_EQ(decoded[out_row * 32 + v], expected) << "row " << row << " value " << v;
    }
  }
}

TEST(HfGptOssTest, SelectsAndTransposesInterleavedRows) {
  // Two experts of 4 rows of 2 one-byte values: [e][r][c] = 100 e + 10 r + c.
  std::vector<uint8_t> src;
  for (int e = 0; e < 2; ++e) {
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 2; ++c) src.push_back(static_cast<uint8_t>(100 * e + 10 * r + c));
    }
  }
  std::vector<uint8_t> odd(8);
  SelectExpertRows(src, 2, 4, /*row_bytes=*/2, /*step=*/2, /*first=*/1, odd);
  EXPECT_EQ(odd, (std::vector<uint8_t>{10, 11, 30, 31, 110, 111, 130, 131}));
  // The same bytes read as [e][k = 4][rows = 2] (a transposed checkpoint tensor): rows (columns) 0 only.
  std::vector<uint8_t> even(8);
  TransposeExpertRows(src, 2, /*k=*/4, /*src_rows=*/2, /*element=*/1, /*step=*/2, /*first=*/0, even);
  EXPECT_EQ(even, (std::vector<uint8_t>{0, 10, 20, 30, 100, 110, 120, 130}));
}

}  // namespace
}  // namespace strata::packtool
