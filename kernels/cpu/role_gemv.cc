#include "kernels/cpu/role_gemv.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/role_gemv_internal.h"

namespace strata::kernels {

std::string_view CpuPathName(CpuPath path) {
  switch (path) {
    case CpuPath::kScalar:
      return "scalar";
    case CpuPath::kAvx2:
      return "avx2";
    case CpuPath::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool CpuPathAvailable(CpuPath path) {
  const CpuFeatures& f = GetCpuFeatures();
  switch (path) {
    case CpuPath::kScalar:
      return true;
    case CpuPath::kAvx2:
      return f.avx2;
    case CpuPath::kAvx512:
      return f.avx512_vnni && f.avx2;
  }
  return false;
}

CpuPath BestCpuPath() {
  static const CpuPath best = CpuPathAvailable(CpuPath::kAvx512) ? CpuPath::kAvx512
                              : CpuPathAvailable(CpuPath::kAvx2) ? CpuPath::kAvx2
                                                                 : CpuPath::kScalar;
  return best;
}

absl::Status CheckRoleGemvArgs(Scheme scheme, int64_t rows, int64_t cols, int64_t row_begin, int64_t row_end,
                               const QuantizedActivation* const* xs, int n_tokens) {
  if (absl::Status s = CheckRoleShape(scheme, rows, cols); !s.ok()) return s;
  if (row_begin < 0 || row_begin > row_end || row_end > rows) {
    return absl::InvalidArgumentError(absl::StrCat("row range [", row_begin, ", ", row_end,
                                                   ") is not inside the role's ", rows, " rows"));
  }
  if (n_tokens < 1 || xs == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("n_tokens is ", n_tokens, ": expected at least 1"));
  }
  for (int t = 0; t < n_tokens; ++t) {
    const QuantizedActivation* x = xs[t];
    if (x == nullptr || x->n != cols || static_cast<int64_t>(x->f32.size()) != cols ||
        static_cast<int64_t>(x->q.size()) != cols || static_cast<int64_t>(x->scale.size()) != cols / kActBlock ||
        static_cast<int64_t>(x->sum.size()) != cols / kActBlock) {
      return absl::InvalidArgumentError(absl::StrCat("activation of token ", t, " does not hold ", cols,
                                                     " elements, the role's cols"));
    }
  }
  return absl::OkStatus();
}

namespace internal {

void RoleGemvScalar(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row_begin,
                    int64_t row_end, const QuantizedActivation* const* xs, int n_tokens, float* const* outs) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int t = 0; t < n_tokens; ++t) outs[t][r] = DotRowReference(scheme, role, rows, cols, r, *xs[t]);
  }
}

}  // namespace internal

void RoleGemvOnPath(CpuPath path, Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols,
                    int64_t row_begin, int64_t row_end, const QuantizedActivation* const* xs, int n_tokens,
                    float* const* outs) {
  switch (path) {
    case CpuPath::kAvx512:
      internal::RoleGemvAvx512(scheme, role, rows, cols, row_begin, row_end, xs, n_tokens, outs);
      return;
    case CpuPath::kAvx2:
      internal::RoleGemvAvx2(scheme, role, rows, cols, row_begin, row_end, xs, n_tokens, outs);
      return;
    case CpuPath::kScalar:
      internal::RoleGemvScalar(scheme, role, rows, cols, row_begin, row_end, xs, n_tokens, outs);
      return;
  }
}

void RoleGemv(Scheme scheme, const uint8_t* role, int64_t rows, int64_t cols, int64_t row_begin,
              int64_t row_end, const QuantizedActivation* const* xs, int n_tokens, float* const* outs) {
  RoleGemvOnPath(BestCpuPath(), scheme, role, rows, cols, row_begin, row_end, xs, n_tokens, outs);
}

}  // namespace strata::kernels
