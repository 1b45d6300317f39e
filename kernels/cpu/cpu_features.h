#ifndef STRATA_KERNELS_CPU_CPU_FEATURES_H_
#define STRATA_KERNELS_CPU_CPU_FEATURES_H_

// What the running CPU supports, read once with cpuid; kernels dispatch on it.

namespace strata::kernels {

struct CpuFeatures {
  bool avx2 = false;         // with FMA and F16C
  bool avx512_vnni = false;  // AVX512 F, BW, VL, DQ and VNNI
};

// The features of this machine; the STRATA_CPU environment variable ("scalar", "avx2") caps them, so the
// scalar and AVX2 paths can be exercised on a machine that has more.
const CpuFeatures& GetCpuFeatures();

}  // namespace strata::kernels

#endif  // STRATA_KERNELS_CPU_CPU_FEATURES_H_
