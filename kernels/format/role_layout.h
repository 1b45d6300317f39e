#ifndef STRATA_KERNELS_FORMAT_ROLE_LAYOUT_H_
#define STRATA_KERNELS_FORMAT_ROLE_LAYOUT_H_

// Offsets inside a role of an integer scheme, following the layout documented in scheme.h. Shared by the
// quantizer, the reference, the SIMD and the CUDA kernels; every function assumes a shape that passed
// CheckRoleShape.

#include <cstdint>

#include "kernels/format/scheme.h"

namespace strata::kernels::layout {

// Bytes of one chunk: 16 rows x 4 int8 lanes.
inline constexpr int64_t kChunkBytes = 64;

STRATA_HOST_DEVICE inline constexpr int CodeBits(Scheme s) {
  return s == Scheme::kS8 ? 8 : s == Scheme::kS4 || s == Scheme::kMxfp4 ? 4 : 2;
}
STRATA_HOST_DEVICE inline constexpr int CodesPerByte(Scheme s) { return 8 / CodeBits(s); }
STRATA_HOST_DEVICE inline constexpr int64_t Group(Scheme s) { return s == Scheme::kS2 ? 64 : 32; }
// Halves a scale record holds per row: scale (and min for s4); mxfp4's rows have one exponent byte instead.
STRATA_HOST_DEVICE inline constexpr int64_t HalvesPerRecord(Scheme s) { return s == Scheme::kS4 ? 2 : 1; }
// Bytes of one row's scale in a record.
STRATA_HOST_DEVICE inline constexpr int64_t ScaleBytes(Scheme s) { return s == Scheme::kMxfp4 ? 1 : 2; }
// Cols one chunk covers.
STRATA_HOST_DEVICE inline constexpr int64_t ChunkCols(Scheme s) { return 4 * CodesPerByte(s); }

STRATA_HOST_DEVICE inline int64_t CodesBytes(Scheme s, int64_t rows, int64_t cols) { return rows * cols / CodesPerByte(s); }
STRATA_HOST_DEVICE inline int64_t TileCodesBytes(Scheme s, int64_t cols) { return kRowTile * cols / CodesPerByte(s); }
STRATA_HOST_DEVICE inline int64_t RecordBytes(Scheme s) { return kRowTile * ScaleBytes(s) * HalvesPerRecord(s); }
STRATA_HOST_DEVICE inline int64_t TileScaleBytes(Scheme s, int64_t cols) { return cols / Group(s) * RecordBytes(s); }

STRATA_HOST_DEVICE inline const uint8_t* TileCodes(Scheme s, const uint8_t* role, int64_t cols, int64_t tile) {
  return role + tile * TileCodesBytes(s, cols);
}
STRATA_HOST_DEVICE inline const uint8_t* TileScales(Scheme s, const uint8_t* role, int64_t rows, int64_t cols, int64_t tile) {
  return role + CodesBytes(s, rows, cols) + tile * TileScaleBytes(s, cols);
}

// Byte and bit shift of the code of (row, col) relative to the role start.
struct CodePos {
  int64_t byte;
  int shift;
};
STRATA_HOST_DEVICE inline CodePos CodePosition(Scheme s, int64_t cols, int64_t row, int64_t col) {
  const int64_t tile = row / kRowTile, i = row % kRowTile;
  const int64_t chunk = col / ChunkCols(s), within = col % ChunkCols(s);
  const int64_t p = within / 4, j = within % 4;
  return {tile * TileCodesBytes(s, cols) + chunk * kChunkBytes + 4 * i + j, static_cast<int>(p * CodeBits(s))};
}

// Byte offset of the scale (a half; mxfp4: the exponent byte) of (row, group); the s4 min follows it at +32.
STRATA_HOST_DEVICE inline int64_t ScaleOffset(Scheme s, int64_t rows, int64_t cols, int64_t row, int64_t group) {
  const int64_t tile = row / kRowTile, i = row % kRowTile;
  return CodesBytes(s, rows, cols) + tile * TileScaleBytes(s, cols) + group * RecordBytes(s) + ScaleBytes(s) * i;
}
inline constexpr int64_t kMinOffsetInRecord = 2 * kRowTile;

}  // namespace strata::kernels::layout

#endif  // STRATA_KERNELS_FORMAT_ROLE_LAYOUT_H_
