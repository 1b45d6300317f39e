#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <string_view>

namespace strata::kernels {
namespace {

CpuFeatures Detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512_vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vnni");
  if (const char* cap = std::getenv("STRATA_CPU"); cap != nullptr) {
    const std::string_view v(cap);
    if (v == "scalar") f = CpuFeatures{};
    if (v == "avx2") f.avx512_vnni = false;
  }
  return f;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

}  // namespace strata::kernels
