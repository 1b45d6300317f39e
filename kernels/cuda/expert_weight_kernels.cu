// The gate/up and down kernels of ExpertFfn (see expert_kernels.cu for the launch sequence and
// kernels/format/scheme.h for the byte layouts).
//
// A warp computes whole 16-row tiles of a role for the T tokens of a work item. Lane = 4 * cl + rg: rg
// (0..3) picks rows 4rg..4rg+3 of each tile and cl (0..7) the lane's share of the cols: for the integer
// schemes the 32-col blocks b = cl, cl + 8, ...; for f16 the 8-col segments at 8cl, 8cl + 64, ....
// For the integer schemes a lane's 16-byte load at chunk k of a tile's codes is rows 4rg..4rg+3 of that chunk, one
// int32 a row; plane p of such an int32 (shift p * bits) is a dp4a operand against activation int32 k * codes_per_byte
// + p (mxfp4's plane mapped to its int8 levels first). Each block's integer sum is exact; each lane accumulates its
// blocks in ascending order in f32 (fmaf, as DotRowReference per block), and the 8 lanes of a row are added in a fixed
// tree, so results do not depend on the tile size, the ring depth or the routing.
//
// Every lane keeps a ring of units (a block, or an f16 segment) loaded ahead of use so that HBM sees
// enough outstanding requests; the ring runs on across the tile boundaries of a warp that owns several
// tiles (down, when expert_ff is small), with the lane's per-tile sums parked in shared memory.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/expert_kernels_internal.cuh"
#include "kernels/cuda/expert_unit_walk.cuh"
#include "kernels/cuda/expert_weight_units.cuh"
#include "kernels/format/expert_layout.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/role_layout.h"

namespace strata::kernels::cuda::expert_internal {
namespace {

// Blocks per SM the kernels are compiled for. Narrow: at most 128 registers a thread without spills, so
// 16 warps of 128 bytes a lane in flight, about 64 KiB per SM, above what HBM latency times bandwidth
// needs (~36 KiB). Wide (compute-bound): 12 warps of up to 168 registers.
template <int kTileMax>
constexpr int kMinBlocksPerSm = kTileMax == kNarrowTile ? 4 : 3;

// Down shares tiles among fewer warps once a call has this many tiles of work (work items x tiles), enough
// to fill the GPU many times over; smaller calls keep a warp a tile, for latency.
constexpr int64_t kShareDownTilesFrom = 32768;

// ---------------------------------------------------------------------------------------------------
// Streaming and reduction. `partial` is the warp's shared [n_tiles][4][T][32] floats: [tile][i][t][lane].

template <int T>
__device__ __forceinline__ void StorePartial(float* partial, int tile, const float (&acc)[4][T], int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int t = 0; t < T; ++t) partial[((tile * 4 + i) * T + t) * 32 + lane] = acc[i][t];
  }
}

// The lane's sums over its units of each of n_tiles consecutive tiles, into `partial`.
template <int T, typename Units>
__device__ __forceinline__ void StreamPartials(const Units& units, int n_tiles, int lane, float* partial) {
  constexpr int kDepth = Units::kDepth, kStep = Units::kStep;
  const int start = units.Start(lane), end = units.End();
  const int per_tile = start < end ? (end - 1 - start) / kStep + 1 : 0;
  const int total = per_tile * n_tiles;
  float acc[4][T];
  ZeroAcc(acc);
  if (per_tile == 0) {
    for (int tile = 0; tile < n_tiles; ++tile) StorePartial(partial, tile, acc, lane);
    return;
  }
  typename Units::Data ring[kDepth];
  int load_tile = 0, load_pos = start;  // the next unit to load
#pragma unroll
  for (int s = 0; s < kDepth; ++s) {
    if (s < total) {
      ring[s] = units.Load(load_tile, load_pos);
      load_pos += kStep;
      if (load_pos >= end) {
        load_pos = start;
        ++load_tile;
      }
    }
  }
  int tile = 0, pos = start;  // the unit to accumulate
  for (int v0 = 0; v0 < total; v0 += kDepth) {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      if (v0 + s < total) {
        const typename Units::Data current = ring[s];
        if (v0 + s + kDepth < total) {
          ring[s] = units.Load(load_tile, load_pos);
          load_pos += kStep;
          if (load_pos >= end) {
            load_pos = start;
            ++load_tile;
          }
        }
        units.Accumulate(current, pos, acc);
        pos += kStep;
        if (pos >= end) {
          StorePartial(partial, tile, acc, lane);
          ZeroAcc(acc);
          pos = start;
          ++tile;
        }
      }
    }
  }
}

// Rows [16 * first_tile, 16 * (first_tile + n_tiles)) of a rows x cols role for T activation rows:
// sink(tile, row, t, value) for tile < n_tiles, row < 16 (within the tile), t < T, spread over the lanes.
// The 8 partial sums of a row are added as ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) by cl.
template <Scheme S, int T, typename Sink>
__device__ __forceinline__ void RowsDot(const uint8_t* role, int64_t rows, int64_t cols, int64_t first_tile,
                                        int n_tiles, const ActBase& act, const int (&first_block)[T], int lane,
                                        float* partial, Sink&& sink) {
  if constexpr (S == Scheme::kF16) {
    StreamPartials<T>(F16Units<T>(role, cols, first_tile, lane, act, first_block), n_tiles, lane, partial);
  } else {
    StreamPartials<T>(IntUnits<S, T>(role, rows, cols, first_tile, lane, act, first_block), n_tiles, lane, partial);
  }
  __syncwarp();
  for (int idx = lane; idx < n_tiles * 16 * T; idx += 32) {
    const int row = idx % 16, t = (idx / 16) % T, tile = idx / (16 * T);
    const float* p = partial + ((tile * 4 + row % 4) * T + t) * 32 + row / 4;
    sink(tile, row, t, ((p[0] + p[4]) + (p[8] + p[12])) + ((p[16] + p[20]) + (p[24] + p[28])));
  }
  __syncwarp();
}

// ---------------------------------------------------------------------------------------------------
// Wide tiles of the integer schemes on the tensor cores. One mma.sync m16n8k32 is one 32-col block of a
// 16-row tile against 8 tokens; its integer sums are the dp4a path's, and the float step per block, the
// residue of the block index that each partial sum takes (b % 8, as lane cl above) and the tree that adds
// the eight partial sums are RowsDot's, so a token's result has the same bits in either path.
//
// Fragments (PTX ISA, mma.m16n8k32 with 8-bit A and B): thread (g = lane / 4, q = lane % 4) holds A's rows g
// and g + 8 at k-slots 4q..4q+3 and 16+4q..16+4q+3, B's column (token) g at the same slots, and D's rows g
// and g + 8 for tokens 2q and 2q + 1. A slot may hold any col as long as A and B agree: slots 4q.. hold
// cols 8q..8q+3 and slots 16+4q.. cols 8q+4..8q+7, so a thread's codes of a row lie in one word of the
// block (two for s8) and its activation codes are 8 consecutive bytes.

// D = A B + kIntFloatMagic: the float with the bits of kIntFloatMagic + v is 12582912 + v exactly for
// |v| < 2^22 (a block's sum is at most 32 * 127 * 127), which converts without the slow I2F.
constexpr int kIntFloatMagic = 0x4B400000;
constexpr float kIntFloatMagicValue = 12582912.0f;

__device__ __forceinline__ float ExactFloat(int biased) { return __int_as_float(biased) - kIntFloatMagicValue; }

// s2 and s4 codes are unsigned (0..3, 0..15); s8 codes and mxfp4's levels are signed.
template <Scheme S>
__device__ __forceinline__ void MmaBlock(const unsigned (&a)[4], uint2 b, int (&d)[4]) {
  if constexpr (S == Scheme::kS2 || S == Scheme::kS4) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(kIntFloatMagic));
  } else {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(kIntFloatMagic));
  }
}

// The A operand of four codes: plane `plane` of `word` (the dp4a path's operand of the same codes).
template <Scheme S>
__device__ __forceinline__ unsigned MmaOperand(unsigned word, int plane) {
  using Sc = IntScheme<S>;
  if constexpr (S == Scheme::kS8) return word;
  const unsigned codes = (word >> (Sc::kBits * plane)) & Sc::kPlaneMask;
  if constexpr (S == Scheme::kMxfp4) return static_cast<unsigned>(Mxfp4Operand(codes));
  return codes;
}

// Tile `tile` (rows 16 * tile ..) of kRoles rows x cols roles (gate and up share their activations) against 8
// activation rows whose first blocks are first_block_of(t), t < 8, over the blocks whose residue b % 8 lies in
// [first_residue, first_residue + kResidues): sink(role, row, t, value) for row < 16 within the tile and t < 8,
// four a lane and role. With all eight residues the value is RowsDot's; with four (kResidues 4, first_residue
// 0 or 4) it is one half of RowsDot's tree, ((p0 + p1) + (p2 + p3)) or ((p4 + p5) + (p6 + p7)), for the caller
// to add in that order.
template <Scheme S, int kRoles, int kResidues, typename FirstBlockOf, typename Sink>
__device__ __forceinline__ void MmaTileDot(const uint8_t* const (&roles)[kRoles], int64_t rows, int64_t cols,
                                           int64_t tile, const ActBase& act, FirstBlockOf&& first_block_of,
                                           int first_residue, int lane, Sink&& sink) {
  static_assert(kResidues == 4 || kResidues == 8);
  using Sc = IntScheme<S>;
  constexpr int64_t kBlockBytes = Sc::kChunksPerBlock * lay::kChunkBytes;
  const int g = lane >> 2, q = lane & 3;
  const int quad0 = 2 * q, quad1 = 2 * q + 1;  // the col quads (4 cols) of the thread's two k-slot groups
  const int plane0 = quad0 % Sc::kPlanes, plane1 = quad1 % Sc::kPlanes;
  // Row g's word of the thread's first quad; row g + 8 at +32, the second quad's chunk at +second.
  constexpr int second = S == Scheme::kS8 ? static_cast<int>(lay::kChunkBytes) : 0;
  const uint8_t* words[kRoles];
  const uint8_t* records[kRoles];
#pragma unroll
  for (int r = 0; r < kRoles; ++r) {
    words[r] = lay::TileCodes(S, roles[r], cols, tile) + lay::kChunkBytes * (quad0 / Sc::kPlanes) + 4 * g;
    records[r] = lay::TileScales(S, roles[r], rows, cols, tile);
  }
  const int8_t* xq = act.q + 32 * static_cast<int64_t>(first_block_of(g)) + 8 * q;
  const int64_t token_block[2] = {first_block_of(quad0), first_block_of(quad1)};
  const int n_blocks = static_cast<int>(cols / 32);

  float acc[kRoles][kResidues][4];
#pragma unroll
  for (int r = 0; r < kRoles; ++r) {
#pragma unroll
    for (int j = 0; j < kResidues; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][j][i] = 0.0f;
    }
  }
  // part[r][i] (D's register i: row g + 8 * (i / 2), token 2q + i % 2) += block b's term, as
  // IntUnits::Accumulate.
  auto step = [&](int b, int j) {
    const uint2 x = __ldg(reinterpret_cast<const uint2*>(xq + 32 * static_cast<int64_t>(b)));
    float xs[2], xsum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      xs[t] = __ldg(act.scale + token_block[t] + b);
      if constexpr (S == Scheme::kS2 || S == Scheme::kS4) {
        xsum[t] = ExactFloat(__ldg(act.sum + token_block[t] + b) + kIntFloatMagic);
      }
    }
#pragma unroll
    for (int r = 0; r < kRoles; ++r) {
      const uint8_t* w = words[r] + b * kBlockBytes;
      const unsigned w0 = __ldg(reinterpret_cast<const unsigned*>(w));
      const unsigned w0_lower = __ldg(reinterpret_cast<const unsigned*>(w + 32));
      unsigned w1 = w0, w1_lower = w0_lower;
      if constexpr (second != 0) {
        w1 = __ldg(reinterpret_cast<const unsigned*>(w + second));
        w1_lower = __ldg(reinterpret_cast<const unsigned*>(w + second + 32));
      }
      const unsigned a[4] = {MmaOperand<S>(w0, plane0), MmaOperand<S>(w0_lower, plane0),
                             MmaOperand<S>(w1, plane1), MmaOperand<S>(w1_lower, plane1)};
      int dot[4];
      MmaBlock<S>(a, x, dot);
      const uint8_t* record = records[r] + (b / Sc::kBlocksPerGroup) * Sc::kRecordBytes;
      float d[2], m[2] = {0.0f, 0.0f};
      if constexpr (S == Scheme::kMxfp4) {
        d[0] = Mxfp4Scale(__ldg(record + g));
        d[1] = Mxfp4Scale(__ldg(record + g + 8));
      } else {
        const unsigned short* halves = reinterpret_cast<const unsigned short*>(record);
        d[0] = HalfBitsToFloat(__ldg(halves + g));
        d[1] = HalfBitsToFloat(__ldg(halves + g + 8));
        if constexpr (S == Scheme::kS4) {
          m[0] = HalfBitsToFloat(__ldg(halves + lay::kMinOffsetInRecord / 2 + g));
          m[1] = HalfBitsToFloat(__ldg(halves + lay::kMinOffsetInRecord / 2 + g + 8));
        }
      }
      float(&part)[4] = acc[r][j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = i >> 1, t = i & 1;
        float v = ExactFloat(dot[i]);
        if constexpr (S == Scheme::kS2) v = fmaf(2.0f, v, -3.0f * xsum[t]);  // levels 2q - 3; exact integers
        part[i] = fmaf(v, d[row] * xs[t], part[i]);
        if constexpr (S == Scheme::kS4) part[i] = fmaf(m[row], xs[t] * xsum[t], part[i]);
      }
    }
  };
  int b0 = 0;
  for (; b0 + 8 <= n_blocks; b0 += 8) {
#pragma unroll
    for (int j = 0; j < kResidues; ++j) step(b0 + first_residue + j, j);
  }
#pragma unroll
  for (int j = 0; j < kResidues; ++j) {
    if (b0 + first_residue + j < n_blocks) step(b0 + first_residue + j, j);
  }
#pragma unroll
  for (int r = 0; r < kRoles; ++r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float(&p)[kResidues][4] = acc[r];
      float v = (p[0][i] + p[1][i]) + (p[2][i] + p[3][i]);
      if constexpr (kResidues == 8) v = v + ((p[4][i] + p[5][i]) + (p[6][i] + p[7][i]));
      sink(r, g + 8 * (i >> 1), 2 * q + (i & 1), v);
    }
  }
}

// Calls body(std::integral_constant<int, T>) with the smallest T in {1, 2, 4, 8} (at most kTileMax) that
// holds `count` tokens; padding tokens repeat the last one and are not stored.
template <int kTileMax, typename Body>
__device__ __forceinline__ void WithTile(int count, Body&& body) {
  if (count <= 1) {
    body(std::integral_constant<int, 1>{});
  } else if (kTileMax == 2 || count == 2) {
    body(std::integral_constant<int, 2>{});
  } else if constexpr (kTileMax > 2) {
    if (count <= 4) {
      body(std::integral_constant<int, 4>{});
    } else {
      body(std::integral_constant<int, 8>{});
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Epilogues

// silu(g) * u, as the CPU computes it.
__device__ __forceinline__ float SwiGlu(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// kernels::ExpertGlu(kClampedSwiGlu, g, u) (llama.cpp's swiglu_oai, alpha 1.702, limit 7): std::min and
// std::clamp written out, so that a NaN passes through as on the CPU.
__device__ __forceinline__ float ClampedSwiGlu(float gate, float up) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  const float g = kLimit < gate ? kLimit : gate;
  const float u = up < -kLimit ? -kLimit : (kLimit < up ? kLimit : up);
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(__fmul_rn(-kAlpha, g)))), __fadd_rn(u, 1.0f));
}

// h of row r of ff for a work item of `expert`, with the extras (ExpertWork::GateUpRows: g + bias, u + bias,
// then the activation).
__device__ __forceinline__ float ExtrasGlu(const FfnArgs& a, int expert, int64_t r, float g, float u) {
  const int64_t at = static_cast<int64_t>(expert) * a.ff + r;
  if (a.extras.gate_bias != nullptr) g = __fadd_rn(g, __ldg(a.extras.gate_bias + at));
  if (a.extras.up_bias != nullptr) u = __fadd_rn(u, __ldg(a.extras.up_bias + at));
  return a.extras.clamped_swiglu ? ClampedSwiGlu(g, u) : SwiGlu(g, u);
}

// ---------------------------------------------------------------------------------------------------
// Kernels. A kernel's work is units: (work item, part of the rows). Narrow tiles and f16: grid (items,
// parts), one unit a block, the item bound along x (items past the prepare kernel's count *n_items exit at
// once). Walking kernels (kWalk, for ExpertFfnExtras::mostly_skipped; integer wide tiles only): units
// numbered item first (unit u is item u % n_items of part u / n_items) and a 1-D grid of at most as many
// blocks as the GPU holds at once, taking them in turn (block b: units b, b + gridDim.x, ...), so that a
// call whose item bound is far above its items (a streamed chunk of a long prompt: a few experts' items
// under a whole layer's bound) launches no blocks that only exit. (f16's loop spilled registers; narrow
// calls are small.)
template <Scheme S, int kTileMax>
constexpr bool kCanWalk = kTileMax == kWideTile && S != Scheme::kF16;

// A unit of GateUpKernel: the 32-row strip `strip` of ff, whose gate and up rows the four warps compute;
// then h = silu(g) * u for the strip, which is one 32-block of h, stored per slot (list position).
template <Scheme S, int kTileMax>
__device__ __forceinline__ void GateUpOfItem(const FfnArgs& a, const WorkItem& item, int64_t strip) {
  __shared__ float gate_up[2][32][kTileMax];  // [gate, up][row of the strip][token]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = 2 * strip + (warp & 1);
  if constexpr (kTileMax == kWideTile && S != Scheme::kF16) {
    // Tensor cores: warp w computes both roles of tile w & 1 over the block residues 4 (w >> 1) ..+3 (one half
    // of RowsDot's tree each), sharing the activation loads between gate and up; the halves meet below.
    __shared__ float halves[2][2][32][kTileMax];  // [residue half][gate, up][row of the strip][token]
    const uint8_t* const both[2] = {item.blob + a.role_offset[kGate], item.blob + a.role_offset[kUp]};
    MmaTileDot<S, 2, 4>(
        both, a.ff, a.n_embd, tile, a.x,
        [&](int t) { return a.list[item.start + min(t, item.count - 1)] / a.k * static_cast<int>(a.n_embd / 32); },
        4 * (warp >> 1), lane,
        [&](int r, int row, int t, float v) { halves[warp >> 1][r][16 * (warp & 1) + row][t] = v; });
    __syncthreads();
    for (int idx = threadIdx.x; idx < 2 * 32 * kTileMax; idx += kFfnThreads) {
      const int r = idx / (32 * kTileMax), row = idx / kTileMax % 32, t = idx % kTileMax;
      gate_up[r][row][t] = halves[0][r][row][t] + halves[1][r][row][t];
    }
  } else {  // warps 0-1: the strip's two tiles of gate, warps 2-3 those of up
    __shared__ float partials[kFfnWarps][4 * kTileMax * 32];
    const int role = warp >> 1;
    const uint8_t* weights = item.blob + a.role_offset[role == 0 ? kGate : kUp];
    WithTile<kTileMax>(item.count, [&](auto tile_size) {
      constexpr int T = decltype(tile_size)::value;
      int first_block[T];
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const int token = a.list[item.start + min(t, item.count - 1)] / a.k;
        first_block[t] = token * static_cast<int>(a.n_embd / 32);
      }
      RowsDot<S, T>(weights, a.ff, a.n_embd, tile, 1, a.x, first_block, lane, partials[warp],
                    [&](int, int row, int t, float v) { gate_up[role][16 * (warp & 1) + row][t] = v; });
    });
  }
  __syncthreads();
  // gpt-oss's extras: a branch on a kernel argument, outside the products.
  const int expert = a.has_extras ? __ldg(a.ids + __ldg(a.list + item.start)) : 0;
  for (int t = warp; t < item.count; t += kFfnWarps) {  // a warp per token, lane = row of the strip
    const float g = gate_up[0][lane][t], u = gate_up[1][lane][t];
    const float h = a.has_extras ? ExtrasGlu(a, expert, 32 * strip + lane, g, u) : SwiGlu(g, u);
    const int64_t slot = item.start + t;
    const int64_t at = slot * a.ff + 32 * strip + lane;
    if constexpr (S == Scheme::kF16) {
      a.hf[at] = h;
    } else {
      const BlockCode c = QuantizeBlock32(h);
      a.hq[at] = static_cast<int8_t>(c.q);
      if (lane == 0) {
        a.hscale[slot * (a.ff / 32) + strip] = c.scale;
        a.hsum[slot * (a.ff / 32) + strip] = c.sum;
      }
    }
  }
}

// Read before the wait (dependent_launch.cuh's rule): what kernels at least two launches back wrote. The gate/up
// kernel (after the prepare kernel) reads the routing and the blob table, which the grouping is made from, and
// the down kernel (after gate/up) the prepare kernel's work items, both through L2; then each warms L2 with the
// weights its first loads will want.
__device__ __forceinline__ void PrefetchL2(const uint8_t* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The codes and scales of 16-row tile `tile` of a role (integer schemes), a line of 128 bytes a lane at a time.
template <Scheme S>
__device__ __forceinline__ void PrefetchTile(const uint8_t* role, int64_t rows, int64_t cols, int64_t tile, int lane) {
  if constexpr (S != Scheme::kF16) {
    const uint8_t* codes = lay::TileCodes(S, role, cols, tile);
    for (int64_t at = 128 * lane; at < lay::TileCodesBytes(S, cols); at += 128 * 32) PrefetchL2(codes + at);
    const uint8_t* scales = lay::TileScales(S, role, rows, cols, tile);
    for (int64_t at = 128 * lane; at < lay::TileScaleBytes(S, cols); at += 128 * 32) PrefetchL2(scales + at);
  }
}

template <Scheme S, int kTileMax, bool kWalk>
__global__ void __launch_bounds__(kFfnThreads, kMinBlocksPerSm<kTileMax>) GateUpKernel(const FfnArgs a) {
  // A decode step's block finds its work item from the routing before the wait (read before the wait, above) and
  // warms L2 with its strip's tiles: warp w's are tile 2 * strip + (w & 1) of gate (w < 2) or up.
  __shared__ WorkItem s_item;
  __shared__ int s_n_items;
  const bool few_pairs = !kWalk && a.n_pairs <= kFewPairs;
  if (few_pairs) {
    if (threadIdx.x < 32) {
      const FewPairsRun run = GroupFewPairs(a.ids, a.n_pairs, a.n_expert, a.tile);
      const WorkItem item = FewPairsItem(run, a.blobs, a.tile, static_cast<int>(blockIdx.x));
      if (threadIdx.x == 0) {
        s_item = item;
        s_n_items = run.n_items;
      }
    }
    __syncthreads();
    if (static_cast<int>(blockIdx.x) < s_n_items) {
      const int warp = threadIdx.x / 32;
      PrefetchTile<S>(s_item.blob + a.role_offset[warp < 2 ? kGate : kUp], a.ff, a.n_embd,
                      2 * static_cast<int64_t>(blockIdx.y) + (warp & 1), threadIdx.x % 32);
    }
  }
  WaitForPriorKernels();
  if constexpr (kWalk) {
    for (UnitWalk walk(a, static_cast<int>(a.ff / 32)); walk.valid(); walk.Next()) {
      GateUpOfItem<S, kTileMax>(a, walk.item, walk.part);
      __syncthreads();  // the next unit's stores to shared memory after this one's loads (belt and braces)
    }
  } else {
    // In bounds (the grid is the item bound); used only if valid.
    const int n_items = few_pairs ? s_n_items : *a.n_items;
    const WorkItem item = few_pairs ? s_item : a.items[blockIdx.x];
    if (static_cast<int>(blockIdx.x) < n_items) GateUpOfItem<S, kTileMax>(a, item, blockIdx.y);
  }
}

// The units of DownKernel a work item has: groups of kFfnWarps * down_tiles_per_warp tiles of down.
__host__ __device__ inline int64_t DownGroups(const FfnArgs& a) {
  const int64_t tiles = a.n_embd / kRowTile, tiles_per_group = int64_t{kFfnWarps} * a.down_tiles_per_warp;
  return (tiles + tiles_per_group - 1) / tiles_per_group;
}

// A unit of DownKernel: a group of kFfnWarps * down_tiles_per_warp tiles of down; a warp streams its
// consecutive tiles (from first_tile) and writes the rows into parts.
template <Scheme S, int kTileMax>
__device__ __forceinline__ void DownOfItem(const FfnArgs& a, const WorkItem& item, int64_t first_tile) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tiles = a.n_embd / kRowTile;
  const int n_tiles = static_cast<int>(min(static_cast<int64_t>(a.down_tiles_per_warp), tiles - first_tile));
  const uint8_t* weights = item.blob + a.role_offset[kDown];
  const ActBase h{a.hq, a.hscale, a.hsum, a.hf};
  // gpt-oss's down bias (the item's expert's row), or null.
  const float* down_bias = nullptr;
  if (a.extras.down_bias != nullptr) {
    down_bias = a.extras.down_bias + static_cast<int64_t>(__ldg(a.ids + __ldg(a.list + item.start))) * a.n_embd;
  }
  auto store = [&](int tile, int row, int t, float v) {
    if (t < item.count) {
      const int64_t pair = a.list[item.start + t];
      const int64_t r = kRowTile * (first_tile + tile) + row;
      a.parts[pair * a.n_embd + r] = down_bias != nullptr ? __fadd_rn(v, __ldg(down_bias + r)) : v;
    }
  };
  if constexpr (kTileMax == kWideTile && S != Scheme::kF16) {
    // One tile a warp: LaunchWeightKernels gives wide calls down_tiles_per_warp 1 (n_tiles is 1 here).
    const uint8_t* const down[1] = {weights};
    MmaTileDot<S, 1, 8>(
        down, a.n_embd, a.ff, first_tile, h,
        [&](int t) { return (item.start + min(t, item.count - 1)) * static_cast<int>(a.ff / 32); }, 0, lane,
        [&](int, int row, int t, float v) { store(0, row, t, v); });
  } else {
    constexpr int kTilesPerWarp = kTileMax == kNarrowTile ? kMaxDownTilesPerWarp : 1;
    __shared__ float partials[kFfnWarps][kTilesPerWarp * 4 * kTileMax * 32];
    WithTile<kTileMax>(item.count, [&](auto tile_size) {
      constexpr int T = decltype(tile_size)::value;
      int first_block[T];
#pragma unroll
      for (int t = 0; t < T; ++t) first_block[t] = (item.start + min(t, item.count - 1)) * static_cast<int>(a.ff / 32);
      RowsDot<S, T>(weights, a.n_embd, a.ff, first_tile, n_tiles, h, first_block, lane, partials[warp], store);
    });
  }
}

template <Scheme S, int kTileMax, bool kWalk>
__global__ void __launch_bounds__(kFfnThreads, kMinBlocksPerSm<kTileMax>) DownKernel(const FfnArgs a) {
  const int64_t tiles = a.n_embd / kRowTile;
  const int warp = threadIdx.x / 32;
  // The work item, written by the prepare kernel two launches back, read before the wait (above), and this warp's
  // tiles warmed in L2.
  int n_items = 0;
  WorkItem item{nullptr, 0, 0};
  int64_t first_tile = 0;
  if constexpr (!kWalk) {
    n_items = __ldcg(a.n_items);
    const int4 raw = __ldcg(reinterpret_cast<const int4*>(a.items + blockIdx.x));
    static_assert(sizeof(WorkItem) == sizeof(int4));
    memcpy(&item, &raw, sizeof(item));
    first_tile = (static_cast<int64_t>(blockIdx.y) * kFfnWarps + warp) * a.down_tiles_per_warp;
    if (static_cast<int>(blockIdx.x) < n_items) {
      for (int64_t t = first_tile; t < min(first_tile + a.down_tiles_per_warp, tiles); ++t) {
        PrefetchTile<S>(item.blob + a.role_offset[kDown], a.n_embd, a.ff, t, threadIdx.x % 32);
      }
    }
  }
  WaitForPriorKernels();
  if constexpr (kWalk) {
    for (UnitWalk walk(a, static_cast<int>(DownGroups(a))); walk.valid(); walk.Next()) {
      const int64_t first_tile = (int64_t{walk.part} * kFfnWarps + warp) * a.down_tiles_per_warp;
      // No barrier in a unit: a warp with no tiles (the last group's) goes on to the next.
      if (first_tile < tiles) DownOfItem<S, kTileMax>(a, walk.item, first_tile);
    }
  } else {
    if (static_cast<int>(blockIdx.x) < n_items && first_tile < tiles) DownOfItem<S, kTileMax>(a, item, first_tile);
  }
}

// The grid of `kernel` for max_items x parts units at most; a walking kernel's is at most its ResidentBlocks.
template <bool kWalk>
absl::Status UnitGrid(void (*kernel)(FfnArgs), int64_t max_items, int64_t parts, dim3* grid) {
  if constexpr (kWalk) {
    const absl::StatusOr<int64_t> resident = ResidentBlocks(kernel, kFfnThreads);
    if (!resident.ok()) return resident.status();
    *grid = dim3(static_cast<unsigned>(std::clamp<int64_t>(max_items * parts, 1, *resident)));
  } else {
    *grid = dim3(static_cast<unsigned>(max_items), static_cast<unsigned>(parts));
  }
  return absl::OkStatus();
}

template <Scheme S, int kTileMax, bool kWalk>
absl::Status LaunchPair(const FfnArgs& a, int64_t max_items, cudaStream_t stream) {
  constexpr auto gate_up_kernel = GateUpKernel<S, kTileMax, kWalk>;
  constexpr auto down_kernel = DownKernel<S, kTileMax, kWalk>;
  dim3 gate_up_grid, down_grid;
  const absl::Status gate_up_sized = UnitGrid<kWalk>(gate_up_kernel, max_items, a.ff / 32, &gate_up_grid);
  if (!gate_up_sized.ok()) return gate_up_sized;
  const absl::Status gate_up =
      LaunchKernel("ExpertFfn gate/up kernel", gate_up_kernel, gate_up_grid, kFfnThreads, 0, stream, a);
  if (!gate_up.ok()) return gate_up;

  const absl::Status down_sized = UnitGrid<kWalk>(down_kernel, max_items, DownGroups(a), &down_grid);
  if (!down_sized.ok()) return down_sized;
  return LaunchKernel("ExpertFfn down kernel", down_kernel, down_grid, kFfnThreads, 0, stream, a);
}

template <Scheme S, int kTileMax>
absl::Status Launch(const FfnArgs& a, int64_t max_items, cudaStream_t stream) {
  if constexpr (kCanWalk<S, kTileMax>) {
    if (a.extras.mostly_skipped) return LaunchPair<S, kTileMax, true>(a, max_items, stream);
  }
  return LaunchPair<S, kTileMax, false>(a, max_items, stream);
}

template <Scheme S>
absl::Status LaunchForScheme(const FfnArgs& a, int tile_max, int64_t max_items, cudaStream_t stream) {
  return tile_max == kWideTile ? Launch<S, kWideTile>(a, max_items, stream)
                               : Launch<S, kNarrowTile>(a, max_items, stream);
}

}  // namespace

absl::Status LaunchWeightKernels(Scheme scheme, const FfnArgs& args, int tile_max, int64_t max_items,
                                 cudaStream_t stream) {
  FfnArgs a = args;
  const int64_t tiles = a.n_embd / kRowTile;
  a.down_tiles_per_warp =
      tile_max == kNarrowTile && max_items * tiles >= kShareDownTilesFrom ? kMaxDownTilesPerWarp : 1;
  switch (scheme) {
    case Scheme::kF16:
      return LaunchForScheme<Scheme::kF16>(a, tile_max, max_items, stream);
    case Scheme::kS8:
      return LaunchForScheme<Scheme::kS8>(a, tile_max, max_items, stream);
    case Scheme::kS4:
      return LaunchForScheme<Scheme::kS4>(a, tile_max, max_items, stream);
    case Scheme::kS2:
      return LaunchForScheme<Scheme::kS2>(a, tile_max, max_items, stream);
    case Scheme::kMxfp4:
      return LaunchForScheme<Scheme::kMxfp4>(a, tile_max, max_items, stream);
  }
  return absl::InvalidArgumentError("ExpertFfn: unknown scheme");
}

}  // namespace strata::kernels::cuda::expert_internal
