#include "packtool/synth_values.h"

#include <xxhash.h>

namespace strata::packtool {

uint64_t SynthStream(uint64_t seed, std::string_view tensor_name) {
  return XXH3_64bits_withSeed(tensor_name.data(), tensor_name.size(), seed);
}

void FillSynthValues(uint64_t stream, uint64_t first, int64_t n, float scale, float offset, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = offset + scale * SynthNormal(stream, first + static_cast<uint64_t>(i));
}

}  // namespace strata::packtool
