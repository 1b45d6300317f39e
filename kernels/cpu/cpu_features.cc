#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <string_view>

namespace strata::kernels {
namespace {

// F16C (half-float conversion), which the AVX2 kernels use; __builtin_cpu_supports has no name for it in
// every compiler, so ask CPUID directly.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

CpuFeatures Detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
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
