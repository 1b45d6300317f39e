#ifndef STRATA_KERNELS_CPU_ROLE_GEMV_H_
#define STRATA_KERNELS_CPU_ROLE_GEMV_H_

// Matrix-vector products of one role against the activations of several tokens, with the implementation
// picked at run time from the CPU's features. All functions are thread-safe; distinct row ranges of one
// role may be computed by different threads at once.

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "kernels/cpu/quantize.h"

namespace strata::kernels {

enum class CpuPath : uint8_t { kScalar, kAvx2, kAvx512 };

std::string_view CpuPathName(CpuPath path);
// Whether this CPU can run `path` (always true for kScalar); honours STRATA_CPU.
bool CpuPathAvailable(CpuPath path);
// The fastest available path, which RoleGemv uses.
CpuPath BestCpuPath();

// OK when RoleGemv's arguments are consistent: a valid shape, 0 <= row_begin <= row_end <= rows,
// 1 <= n_tokens, every xs[t] non-null with n == cols and sized vectors. RoleGemv itself does not check.
absl::Status CheckRoleGemvArgs(Scheme scheme, int64_t rows, int64_t cols, int64_t row_begin, int64_t row_end,
                               const QuantizedActivation* const* xs, int n_tokens);

// outs[t][r] = row r of the role . xs[t], for r in [row_begin, row_end) and t < n_tokens; other elements of
// outs are not touched. The weights are streamed once for all tokens. The result equals DotRowReference
// bit for bit for the integer schemes, and within float rounding (about 1e-6 of sum |w*x|) for f16.
// Rows need not be tile-aligned, but a range cut inside a tile recomputes that tile's other rows.
void RoleGemv(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row_begin,
              int64_t row_end, const QuantizedActivation* const* xs, int n_tokens, float* const* outs);

// RoleGemv on a given path, which must be available; for tests and benchmarks.
void RoleGemvOnPath(CpuPath path, Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols,
                    int64_t row_begin, int64_t row_end, const QuantizedActivation* const* xs, int n_tokens,
                    float* const* outs);

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_ROLE_GEMV_H_
