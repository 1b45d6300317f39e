#ifndef STRATA_PACKTOOL_HF_FP8_H_
#define STRATA_PACKTOOL_HF_FP8_H_

// FP8 block-scaled weights as DeepSeek-V3 ships them: a 2-D F8_E4M3 tensor `<name>` of [rows, cols] and an
// F32 tensor `<name>_scale_inv` of [ceil(rows / 128), ceil(cols / 128)], one factor per 128 x 128 block
// (the last blocks may be partial): weight[r][c] = e4m3(code[r][c]) * scale_inv[r / 128][c / 128], computed
// in f32 as llama.cpp's converter (and PyTorch) do.
//
// Imported as BF16: the product is rounded to nearest-even bf16 (8 significant bits, a relative error of at
// most 2^-9, far below what any pack scheme adds). BF16 is what the rest of the checkpoint is, what llama.cpp's
// converter writes for it (--outtype auto/bf16), and half the size of f32 in the temporary GGUF, which for
// DeepSeek-V3 is 1.3 TB in bf16. Pure functions, any thread.

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::packtool {

inline constexpr int64_t kFp8BlockSize = 128;

// The value of an OCP E4M3 ("e4m3fn") byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (mantissa * 2^-9); no infinities; S.1111.111 is NaN (returned as a quiet NaN).
float DecodeE4m3(uint8_t code);

// Checks config.json's "quantization_config" (`path` names the file in errors): absent is fine (returns
// false: no FP8 weights expected); {"quant_method": "fp8", "weight_block_size": [128, 128], ...} returns true;
// anything else is UNIMPLEMENTED naming the field and what Strata reads.
absl::StatusOr<bool> ReadFp8QuantizationConfig(const nlohmann::json& config, const std::string& path);

// Writes rows x cols bf16 values (little-endian) into `dst` from the row-major E4M3 `codes` and the
// row-major f32 `scale_inv` of ceil(rows / 128) x ceil(cols / 128). `name` names the tensor in errors: a NaN
// code, or a product that is not finite, is INVALID_ARGUMENT with its row and column; so are spans of other
// sizes than rows x cols codes, 4 bytes a block of scales and 2 bytes a value of dst.
absl::Status DequantizeFp8Blocks(std::span<const uint8_t> codes, std::span<const uint8_t> scale_inv, int64_t rows,
                                 int64_t cols, const std::string& name, std::span<uint8_t> dst);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_HF_FP8_H_
