#ifndef STRATA_PACKTOOL_SYNTH_VALUES_H_
#define STRATA_PACKTOOL_SYNTH_VALUES_H_

// Deterministic pseudo-random weights for synthetic models: value = f(seed, tensor, element index), so any
// slice of any tensor can be produced independently, by any thread, with the same result.

#include <cstdint>
#include <string_view>

namespace strata::packtool {

// Identifies a tensor's stream of values: a hash of the seed and the tensor's name.
uint64_t SynthStream(uint64_t seed, std::string_view tensor_name);

// An approximately standard normal value (sum of four uniforms, rescaled to unit variance), for element
// `index` of the stream.
inline float SynthNormal(uint64_t stream, uint64_t index) {
  uint64_t z = stream + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const uint32_t a = static_cast<uint32_t>(z & 0xFFFF), b = static_cast<uint32_t>((z >> 16) & 0xFFFF),
                 c = static_cast<uint32_t>((z >> 32) & 0xFFFF), d = static_cast<uint32_t>(z >> 48);
  // Each uniform has variance 1/12, so the sum of four has 1/3; sqrt(3) restores unit variance.
  const float sum = static_cast<float>(a + b + c + d) * (1.0f / 65536.0f) - 2.0f;
  return sum * 1.7320508f;
}

// Fills dst[i] = offset + scale * SynthNormal(stream, first + i) for i < n.
void FillSynthValues(uint64_t stream, uint64_t first, int64_t n, float scale, float offset, float* dst);

}  // namespace strata::packtool

#endif  // STRATA_PACKTOOL_SYNTH_VALUES_H_
