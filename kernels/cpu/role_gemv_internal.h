#ifndef STRATA_KERNELS_CPU_ROLE_GEMV_INTERNAL_H_
#define STRATA_KERNELS_CPU_ROLE_GEMV_INTERNAL_H_

// The per-instruction-set RoleGemv implementations behind role_gemv.h. Each is defined in a file compiled
// for its instruction set and may only be called when the CPU has it.

#include <cstdint>

#include "kernels/cpu/quantize.h"

namespace strata::kernels::internal {

// Tokens one pass over a tile computes; more tokens take further passes over the (cached) tile.
inline constexpr int kMaxTokensPerPass = 4;

void RoleGemvScalar(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row_begin,
                    int64_t row_end, const QuantizedActivation* const* xs, int n_tokens, float* const* outs);
void RoleGemvAvx2(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row_begin,
                  int64_t row_end, const QuantizedActivation* const* xs, int n_tokens, float* const* outs);
void RoleGemvAvx512(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row_begin,
                    int64_t row_end, const QuantizedActivation* const* xs, int n_tokens, float* const* outs);

}  // namespace strata::kernels::internal

#endif  // STRATA_KERNELS_CPU_ROLE_GEMV_INTERNAL_H_
