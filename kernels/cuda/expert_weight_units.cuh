#ifndef STRATA_KERNELS_CUDA_EXPERT_WEIGHT_UNITS_CUH_
#define STRATA_KERNELS_CUDA_EXPERT_WEIGHT_UNITS_CUH_

// How a lane of the expert weight kernels (expert_weight_kernels.cu, which describes the lane layout) reads
// and accumulates one unit of a role for each scheme: a 32-col block of integer codes (IntUnits) or an 8-col
// segment of f16 (F16Units). Not part of the API; nvcc only.

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/dense_device.cuh"
#include "kernels/cuda/expert_kernels_internal.cuh"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"
#include "kernels/format/scheme.h"

namespace strata::kernels::cuda::expert_internal {

namespace lay = ::strata::kernels::layout;

// 16 bytes of weights, read once per work item: the dense kernels' streaming load (kept out of L1, where the
// activations live; L2 still serves the other work items of the same expert), as four int32 words.
__device__ __forceinline__ int4 LoadWeights16(const uint8_t* p) {
  const uint4 v = detail::LoadStreaming16(p);
  return make_int4(static_cast<int>(v.x), static_cast<int>(v.y), static_cast<int>(v.z), static_cast<int>(v.w));
}

__device__ __forceinline__ float HalfBitsToFloat(unsigned bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
}

template <int T>
__device__ __forceinline__ void ZeroAcc(float (&acc)[4][T]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int t = 0; t < T; ++t) acc[i][t] = 0.0f;
  }
}

// ---------------------------------------------------------------------------------------------------
// Units: what one lane loads and accumulates per step. Each provides kStep (the distance between a lane's
// positions), kDepth (units in flight), Data, Start(lane), End(), Load(tile, position) and
// Accumulate(data, position, acc) with acc[i][t] for row 4rg+i and token t.

template <Scheme S>
struct IntScheme {
  static constexpr int kBits = lay::CodeBits(S);
  static constexpr int kPlanes = 8 / kBits;      // codes per byte
  static constexpr int kChunksPerBlock = kBits;  // 64-byte chunks a 32-col block spans: 32 / (4 * kPlanes)
  static constexpr int kBlocksPerGroup = static_cast<int>(lay::Group(S) / 32);
  static constexpr int kRecordBytes = static_cast<int>(kRowTile * lay::ScaleBytes(S) * lay::HalvesPerRecord(S));
  static constexpr int kLaneScaleBytes = 4 * static_cast<int>(lay::ScaleBytes(S));  // rows 4rg..4rg+3 of a record
  static constexpr unsigned kPlaneMask = S == Scheme::kS2 ? 0x03030303u : 0x0F0F0F0Fu;
};

// Four mxfp4 codes (one a byte, 0..15) as the int8 levels of kernels/format/mxfp4.h, a dp4a operand: the
// magnitude's 3 bits pick a byte of {0, 1, 2, 3 | 4, 6, 8, 12} (prmt), and bit 3 selects its negative.
__device__ __forceinline__ int Mxfp4Operand(unsigned codes) {
  unsigned x = codes & 0x07070707u;
  x = (x | (x >> 4)) & 0x00FF00FFu;                         // two 4-bit selectors in bytes 0 and 2
  const unsigned selector = (x & 0xFFu) | ((x >> 8) & 0xFF00u);
  const unsigned positive = __byte_perm(0x03020100u, 0x0C080604u, selector);
  const unsigned negative = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, selector);  // 0, -1, -2, -3 | -4, -6, -8, -12
  const unsigned sign = ((codes >> 3) & 0x01010101u) * 0xFFu;                 // 0xFF in each negative byte
  return static_cast<int>((positive & ~sign) | (negative & sign));
}

// One lane's share of a 32-col block: codes[c] = the int32 of rows 4rg..4rg+3 (x, y, z, w) in the block's
// chunk c; d = their scales, two halves a word, low half first (mxfp4: four exponent bytes in d.x); m = their
// mins (s4).
template <Scheme S>
struct IntBlock {
  int4 codes[IntScheme<S>::kChunksPerBlock];
  uint2 d;
  uint2 m;
};

template <Scheme S, int T>
struct IntUnits {
  using Sc = IntScheme<S>;
  using Data = IntBlock<S>;
  static constexpr int kStep = 8;
  // 128 bytes of codes in flight per lane for narrow tiles; half (at least one block) for wide tiles,
  // whose registers go to the accumulators.
  static constexpr int kFullDepth = 8 / Sc::kChunksPerBlock;
  static constexpr int kDepth = T >= 4 ? (kFullDepth > 1 ? kFullDepth / 2 : 1) : kFullDepth;

  const uint8_t* codes;   // the lane's 16 bytes of chunk 0 of the first tile
  const uint8_t* scales;  // the lane's 8 bytes (mxfp4: 4) of record 0 of the first tile
  int64_t tile_codes_bytes;
  int64_t tile_scale_bytes;
  int n_blocks;
  ActBase act;
  int first_block[T];

  __device__ __forceinline__ IntUnits(const uint8_t* role, int64_t rows, int64_t cols, int64_t first_tile, int lane,
                                      const ActBase& a, const int (&first)[T])
      : tile_codes_bytes(lay::TileCodesBytes(S, cols)),
        tile_scale_bytes(lay::TileScaleBytes(S, cols)),
        n_blocks(static_cast<int>(cols / 32)),
        act(a) {
    const int rg = lane & 3;
    codes = role + first_tile * tile_codes_bytes + 16 * rg;
    scales = role + lay::CodesBytes(S, rows, cols) + first_tile * tile_scale_bytes + Sc::kLaneScaleBytes * rg;
#pragma unroll
    for (int t = 0; t < T; ++t) first_block[t] = first[t];
  }

  __device__ __forceinline__ int Start(int lane) const { return lane >> 2; }
  __device__ __forceinline__ int End() const { return n_blocks; }

  __device__ __forceinline__ Data Load(int tile, int b) const {
    Data blk;
    const uint8_t* chunk = codes + tile * tile_codes_bytes + static_cast<int64_t>(b) * Sc::kChunksPerBlock * 64;
#pragma unroll
    for (int c = 0; c < Sc::kChunksPerBlock; ++c) blk.codes[c] = LoadWeights16(chunk + 64 * c);
    const uint8_t* record = scales + tile * tile_scale_bytes + (b / Sc::kBlocksPerGroup) * Sc::kRecordBytes;
    // mxfp4: the four rows' exponent bytes in d.x.
    blk.d = S == Scheme::kMxfp4 ? make_uint2(__ldg(reinterpret_cast<const unsigned*>(record)), 0u)
                                : __ldg(reinterpret_cast<const uint2*>(record));
    blk.m = S == Scheme::kS4 ? __ldg(reinterpret_cast<const uint2*>(record + lay::kMinOffsetInRecord))
                             : make_uint2(0, 0);
    return blk;
  }

  __device__ __forceinline__ void Accumulate(const Data& blk, int b, float (&acc)[4][T]) const {
    float d[4];
    if constexpr (S == Scheme::kMxfp4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) d[i] = Mxfp4Scale(static_cast<uint8_t>(blk.d.x >> (8 * i)));
    } else {
      d[0] = HalfBitsToFloat(blk.d.x), d[1] = HalfBitsToFloat(blk.d.x >> 16);
      d[2] = HalfBitsToFloat(blk.d.y), d[3] = HalfBitsToFloat(blk.d.y >> 16);
    }
    const float m[4] = {HalfBitsToFloat(blk.m.x), HalfBitsToFloat(blk.m.x >> 16), HalfBitsToFloat(blk.m.y),
                        HalfBitsToFloat(blk.m.y >> 16)};
    // op[i][j]: row 4rg+i's codes of the block's cols 4j .. 4j+3, against activation int32 j.
    int op[4][8];
#pragma unroll
    for (int c = 0; c < Sc::kChunksPerBlock; ++c) {
      const unsigned words[4] = {static_cast<unsigned>(blk.codes[c].x), static_cast<unsigned>(blk.codes[c].y),
                                 static_cast<unsigned>(blk.codes[c].z), static_cast<unsigned>(blk.codes[c].w)};
#pragma unroll
      for (int p = 0; p < Sc::kPlanes; ++p) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const unsigned plane = (words[i] >> (Sc::kBits * p)) & Sc::kPlaneMask;
          op[i][c * Sc::kPlanes + p] = S == Scheme::kS8       ? static_cast<int>(words[i])
                                       : S == Scheme::kMxfp4 ? Mxfp4Operand(plane)
                                                              : static_cast<int>(plane);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const int64_t block = static_cast<int64_t>(first_block[t]) + b;
      const int4* xq = reinterpret_cast<const int4*>(act.q + 32 * block);
      const int4 a0 = __ldg(xq), a1 = __ldg(xq + 1);
      const int a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float xs = __ldg(act.scale + block);
      const int xsum = S == Scheme::kS8 || S == Scheme::kMxfp4 ? 0 : __ldg(act.sum + block);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        int dot = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot = __dp4a(op[i][j], a[j], dot);
        if constexpr (S == Scheme::kS2) dot = 2 * dot - 3 * xsum;  // levels 2q - 3
        acc[i][t] = fmaf(static_cast<float>(dot), d[i] * xs, acc[i][t]);
        if constexpr (S == Scheme::kS4) acc[i][t] = fmaf(m[i], xs * static_cast<float>(xsum), acc[i][t]);
      }
    }
  }
};

template <int T>
struct F16Units {
  struct Data {
    int4 w[4];  // 8 halves of each of rows 4rg..4rg+3
  };
  static constexpr int kStep = 64;
  static constexpr int kDepth = T >= 4 ? 1 : 2;

  const uint8_t* row0;  // the lane's first row (4rg) of the first tile
  int64_t cols;
  const float* act;
  int first_block[T];

  __device__ __forceinline__ F16Units(const uint8_t* role, int64_t n_cols, int64_t first_tile, int lane,
                                      const ActBase& a, const int (&first)[T])
      : row0(role + 2 * (kRowTile * first_tile + 4 * (lane & 3)) * n_cols), cols(n_cols), act(a.f32) {
#pragma unroll
    for (int t = 0; t < T; ++t) first_block[t] = first[t];
  }

  __device__ __forceinline__ int Start(int lane) const { return 8 * (lane >> 2); }
  __device__ __forceinline__ int End() const { return static_cast<int>(cols); }

  __device__ __forceinline__ Data Load(int tile, int c) const {
    Data st;
    const uint8_t* p = row0 + 2 * (kRowTile * tile * cols + c);
#pragma unroll
    for (int i = 0; i < 4; ++i) st.w[i] = LoadWeights16(p + 2 * i * cols);
    return st;
  }

  __device__ __forceinline__ void Accumulate(const Data& st, int c, float (&acc)[4][T]) const {
    float w[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int words[4] = {st.w[i].x, st.w[i].y, st.w[i].z, st.w[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[j]));
        w[i][2 * j] = f.x;
        w[i][2 * j + 1] = f.y;
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float4* xp = reinterpret_cast<const float4*>(act + 32 * static_cast<int64_t>(first_block[t]) + c);
      const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
      const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][t] = fmaf(w[i][j], x[j], acc[i][t]);
      }
    }
  }
};

}  // namespace strata::kernels::cuda::expert_internal

#endif  // STRATA_KERNELS_CUDA_EXPERT_WEIGHT_UNITS_CUH_
