#include "packtool/hf_fp8.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/format/fp16.h"

namespace strata::packtool {

float DecodeE4m3(uint8_t code) {
  const int exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  // Normal: (8 + m) / 8 * 2^(e - 7); subnormal: m / 8 * 2^-6.
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

absl::StatusOr<bool> ReadFp8QuantizationConfig(const nlohmann::json& config, const std::string& path) {
  if (!config.contains("quantization_config") || config["quantization_config"].is_null()) return false;
  const nlohmann::json& q = config["quantization_config"];
  const std::string where = absl::StrCat(path, ": quantization_config");
  const std::string expected = "Strata reads FP8 weights with 128 x 128 blocks (quant_method \"fp8\", "
                               "weight_block_size [128, 128])";
  if (!q.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected an object"));
  if (!q.contains("quant_method") || !q["quant_method"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".quant_method: missing (", expected, ")"));
  }
  const std::string method = q["quant_method"].get<std::string>();
  if (method != "fp8") {
    return absl::UnimplementedError(
        absl::StrCat(where, ".quant_method: '", method, "' is not supported (", expected, ")"));
  }
  const nlohmann::json block = q.value("weight_block_size", nlohmann::json());
  if (block != nlohmann::json::array({kFp8BlockSize, kFp8BlockSize})) {
    return absl::UnimplementedError(
        absl::StrCat(where, ".weight_block_size: ", block.dump(), " is not supported (", expected, ")"));
  }
  if (q.contains("fmt") && q["fmt"] != "e4m3") {
    return absl::UnimplementedError(absl::StrCat(where, ".fmt: ", q["fmt"].dump(), " is not supported (expected \"e4m3\")"));
  }
  return true;
}

absl::Status DequantizeFp8Blocks(std::span<const uint8_t> codes, std::span<const uint8_t> scale_inv, int64_t rows,
                                 int64_t cols, const std::string& name, std::span<uint8_t> dst) {
  static const std::array<float, 256> kValues = [] {
    std::array<float, 256> v;
    for (int i = 0; i < 256; ++i) v[static_cast<size_t>(i)] = DecodeE4m3(static_cast<uint8_t>(i));
    return v;
  }();
  const int64_t block_cols = (cols + kFp8BlockSize - 1) / kFp8BlockSize;
  const int64_t block_rows = (rows + kFp8BlockSize - 1) / kFp8BlockSize;
  if (rows < 0 || cols < 0 || codes.size() != static_cast<uint64_t>(rows * cols) ||
      scale_inv.size() != static_cast<uint64_t>(block_rows * block_cols * 4) ||
      dst.size() != static_cast<uint64_t>(rows * cols * 2)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", codes.size(), " FP8 codes, ", scale_inv.size(),
                                                   " bytes of scale_inv and ", dst.size(), " bytes out for ", rows,
                                                   " x ", cols, " (expected ", rows * cols, ", ",
                                                   block_rows * block_cols * 4, " and ", rows * cols * 2, ")"));
  }
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = codes.data() + r * cols;
    const uint8_t* scales = scale_inv.data() + (r / kFp8BlockSize) * block_cols * 4;
    uint8_t* out = dst.data() + r * cols * 2;
    for (int64_t c = 0; c < cols; ++c) {
      float scale;
      std::memcpy(&scale, scales + (c / kFp8BlockSize) * 4, 4);
      const float code_value = kValues[row[c]];
      const float value = code_value * scale;  // f32, as the reference converters compute it
      if (!std::isfinite(value)) {
        const std::string what = std::isnan(code_value)
                                     ? std::string("is an FP8 NaN")
                                     : absl::StrCat("is ", code_value, " * scale_inv ", scale, ", not finite");
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "': element [", r, ", ", c, "] ", what, "; expected a finite weight"));
      }
      kernels::StoreHalf(kernels::FloatToBf16(value), out + c * 2);
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::packtool
