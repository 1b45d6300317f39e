#ifndef STRATA_ENGINE_GGUF_GGML_QUANTS_H_
#define STRATA_ENGINE_GGUF_GGML_QUANTS_H_

// Block codecs behind ggml_types.h; private to engine/gguf. Callers have already checked the type, the
// block count and the buffer sizes, so these functions only do arithmetic. Pure functions.

#include <cstdint>

#include "engine/gguf/ggml_types.h"

namespace strata::gguf::internal {

// Decodes `n_blocks` blocks of a type whose GgmlTypeInfo says can_dequantize. Returns false for any
// other type (nothing written).
bool DequantizeBlocks(GgmlType type, const uint8_t* src, float* dst, int64_t n_blocks);

// Encodes `n_blocks` blocks of F32, F16, BF16, Q8_0, Q4_0 or Q4_1 from finite inputs. Returns false for
// any other type.
bool QuantizeBlocks(GgmlType type, const float* src, uint8_t* dst, int64_t n_blocks);

}  // namespace strata::gguf::internal

#endif  // STRATA_ENGINE_GGUF_GGML_QUANTS_H_
