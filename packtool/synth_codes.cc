#include "packtool/synth_codes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/format/fp16.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"

namespace strata::packtool {
namespace {

using kernels::Scheme;

// SplitMix64 (Steele, Lea, Flood 2014): 64 random bits per call, plenty for weights no one fits.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// A bijective 64-bit hash (one SplitMix64 step), to derive independent-looking seeds.
uint64_t Mix64(uint64_t x) { return SplitMix64(x).Next(); }

// Scales are drawn per (row, group) from this many values, 4 random bits each: one 64-bit draw per record.
constexpr int kScaleChoices = 16;
static_assert(kernels::kRowTile * 4 == 64);

// The k-th scale as a multiple of the base: 0.766 .. 1.234 in even steps.
double ScaleFactor(int k) { return 1.0 + (k - 7.5) / 32.0; }

// Returns x with every byte equal to 0x80 replaced by 0 and the other bytes kept: s8 codes are int8 in
// [-127, 127], and 0x80 is -128.
uint64_t ClearBytes0x80(uint64_t x) {
  constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7Full;
  const uint64_t y = x ^ 0x8080808080808080ull;              // the 0x80 bytes of x are the 0x00 bytes of y
  const uint64_t zero = ~(((y & kLow7) + kLow7) | y | kLow7);  // 0x80 in each 0x00 byte of y, no carries
  return x & ~((zero >> 7) * 0xFF);
}

// Fills dst[0 .. n) with random bytes; with no_0x80, 0x80 bytes are written as 0.
void FillRandomBytes(SplitMix64& rng, bool no_0x80, uint8_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t r = rng.Next();
    if (no_0x80) r = ClearBytes0x80(r);
    std::memcpy(dst + i, &r, 8);
  }
  if (i < n) {
    uint64_t r = rng.Next();
    if (no_0x80) r = ClearBytes0x80(r);
    std::memcpy(dst + i, &r, static_cast<size_t>(n - i));
  }
}

// f16 values are entries of a table of this many, picked by 12 random bits (5 per 64-bit draw).
constexpr int kNormalTableBits = 12;
constexpr int kNormalTableSize = 1 << kNormalTableBits;

// The standard normal quantiles at probabilities (k + 0.5) / kNormalTableSize, rescaled to a mean square of
// exactly 1: a uniformly random entry is a standard normal value truncated at about +-3.7. Computed once, by
// bisection on the normal CDF, Phi(x) = erfc(-x / sqrt(2)) / 2.
const std::vector<double>& NormalQuantiles() {
  static const std::vector<double>* table = [] {
    auto* t = new std::vector<double>(kNormalTableSize);
    double sum2 = 0;
    for (int k = 0; k < kNormalTableSize; ++k) {
      const double p = (k + 0.5) / kNormalTableSize;
      double lo = -10, hi = 10;
      for (int iteration = 0; iteration < 64; ++iteration) {
        const double mid = (lo + hi) / 2;
        if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p) {
          lo = mid;
        } else {
          hi = mid;
        }
      }
      (*t)[k] = (lo + hi) / 2;
      sum2 += (*t)[k] * (*t)[k];
    }
    const double rms = std::sqrt(sum2 / kNormalTableSize);
    for (double& x : *t) x /= rms;
    return t;
  }();
  return *table;
}

// The f16 scheme: n halves of stddev x a random entry of NormalQuantiles, row-major.
void FillF16Role(SplitMix64& rng, int64_t n, float stddev, uint8_t* dst) {
  const std::vector<double>& quantiles = NormalQuantiles();
  std::vector<uint16_t> halves(kNormalTableSize);
  for (int k = 0; k < kNormalTableSize; ++k) halves[k] = kernels::FloatToHalf(static_cast<float>(stddev * quantiles[k]));
  constexpr int kPerDraw = 64 / kNormalTableBits;
  for (int64_t i = 0; i < n; i += kPerDraw) {
    uint64_t bits = rng.Next();
    for (int64_t j = i; j < std::min<int64_t>(n, i + kPerDraw); ++j, bits >>= kNormalTableBits) {
      kernels::StoreHalf(halves[bits & (kNormalTableSize - 1)], dst + 2 * j);
    }
  }
}

}  // namespace

double RandomCodeLevelMeanSquare(Scheme scheme) {
  double sum = 0;
  switch (scheme) {
    case Scheme::kF16:
      return 1.0;
    case Scheme::kS8:
      // Bytes 0 .. 255 read as int8, with -128 (0x80) written as 0.
      for (int b = 0; b < 256; ++b) {
        const int q = b == 0x80 ? 0 : static_cast<int8_t>(b);
        sum += static_cast<double>(q) * q;
      }
      return sum / 256;
    case Scheme::kS4:
      for (int q = 0; q < 16; ++q) sum += (q - 7.5) * (q - 7.5);
      return sum / 16;
    case Scheme::kS2:
      for (int q = 0; q < 4; ++q) sum += static_cast<double>(2 * q - 3) * (2 * q - 3);
      return sum / 4;
    case Scheme::kMxfp4:
      for (int8_t level : kernels::kMxfp4Levels) sum += static_cast<double>(level) * level;
      return sum / 16;
  }
  return 1.0;
}

absl::Status FillRandomRole(Scheme scheme, int64_t rows, int64_t cols, float stddev, uint64_t stream,
                            uint64_t first, uint8_t* dst) {
  if (!(stddev > 0) || !std::isfinite(stddev)) {
    return absl::InvalidArgumentError(
        absl::StrCat("random role: standard deviation ", stddev, " is not positive and finite"));
  }
  // Seeded by the tensor and the role's place in it, so that every (tensor, expert) draws its own sequence.
  SplitMix64 rng(Mix64(stream ^ Mix64(first)));
  if (scheme == Scheme::kF16) {
    FillF16Role(rng, rows * cols, stddev, dst);
    return absl::OkStatus();
  }
  namespace layout = kernels::layout;

  // Scale choices: mean(scale^2) x mean(level^2) = stddev^2.
  double factor_mean_square = 0;
  for (int k = 0; k < kScaleChoices; ++k) factor_mean_square += ScaleFactor(k) * ScaleFactor(k) / kScaleChoices;
  const double base = stddev / std::sqrt(factor_mean_square * RandomCodeLevelMeanSquare(scheme));
  // mxfp4's scales are powers of two: the choices are two neighbouring ones, p and 2p, mixed so that their
  // mean square is the one above to within 3/32 of p^2 (the spread's standard deviation within about 5%).
  const double mean_square = base * base * factor_mean_square;
  const int p_exponent = static_cast<int>(std::floor(0.5 * std::log2(mean_square)));
  const double p2 = std::ldexp(1.0, 2 * p_exponent);
  const int n_high = std::clamp(static_cast<int>(std::lround((kScaleChoices * mean_square / p2 - kScaleChoices) / 3)),
                                0, kScaleChoices);
  uint16_t scales[kScaleChoices], mins[kScaleChoices];
  for (int k = 0; k < kScaleChoices; ++k) {
    const int exponent_byte = std::clamp(p_exponent + (k < n_high ? 1 : 0) + 128, 0, 255);
    scales[k] = scheme == Scheme::kMxfp4 ? static_cast<uint16_t>(exponent_byte)
                                         : kernels::FloatToHalf(static_cast<float>(base * ScaleFactor(k)));
    const float d = scheme == Scheme::kMxfp4 ? kernels::Mxfp4Scale(static_cast<uint8_t>(scales[k]))
                                             : kernels::HalfToFloat(scales[k]);
    // s4: w = d q + m with q uniform over 0 .. 15 is centred when m = -7.5 d.
    mins[k] = kernels::FloatToHalf(-7.5f * d);
    if (!(d > 0) || !std::isfinite(d) || (scheme == Scheme::kS4 && !std::isfinite(kernels::HalfToFloat(mins[k])))) {
      return absl::InternalError(absl::StrCat("random role: standard deviation ", stddev,
                                              " gives a scale that is not a positive, finite half"));
    }
  }

  const int64_t codes_bytes = layout::CodesBytes(scheme, rows, cols);
  // Every byte of the code plane is valid codes for s2, s4 and mxfp4 (all bit patterns are levels) and for s8
  // except -128.
  FillRandomBytes(rng, /*no_0x80=*/scheme == Scheme::kS8, dst, codes_bytes);

  // The scale plane is a run of records, one per (tile, group), each holding a scale per row of the tile
  // (then a min per row for s4); which record belongs to which group does not matter for random scales.
  const int64_t records = rows / kernels::kRowTile * (cols / layout::Group(scheme));
  uint8_t* record = dst + codes_bytes;
  for (int64_t r = 0; r < records; ++r, record += layout::RecordBytes(scheme)) {
    uint64_t bits = rng.Next();  // 16 rows x 4 bits
    for (int64_t i = 0; i < kernels::kRowTile; ++i, bits >>= 4) {
      const int k = static_cast<int>(bits & (kScaleChoices - 1));
      if (scheme == Scheme::kMxfp4) {
        record[i] = static_cast<uint8_t>(scales[k]);
        continue;
      }
      kernels::StoreHalf(scales[k], record + 2 * i);
      if (scheme == Scheme::kS4) kernels::StoreHalf(mins[k], record + layout::kMinOffsetInRecord + 2 * i);
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::packtool
