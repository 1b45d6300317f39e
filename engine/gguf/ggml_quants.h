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

// Encodes `n_blocks` blocks of F32, F16, BF16, Q8_0, Q4_0, Q4_1 or Q2_K .. Q6_K from finite inputs.
// Returns false for any other type.
bool QuantizeBlocks(GgmlType type, const float* src, uint8_t* dst, int64_t n_blocks);

// For Q4_0, Q4_1 and Q4_K (false for any other type, nothing written): the 4-bit codes of `n_blocks` blocks
// (codes[i] in 0..15 for element i) and each run of 32 elements' scale and offset, such that the decoder's
// value of element i equals scale[i / 32] * codes[i] + offset[i / 32] in float (a zero's sign may differ).
bool ReadAffine4Blocks(GgmlType type, const uint8_t* src, int64_t n_blocks, uint8_t* codes, float* scale,
                       float* offset);

// MXFP4 blocks' doubled E2M1 values (32 a block) and exponents (one a block): see gguf::ReadMxfp4Codes.
void ReadMxfp4Blocks(const uint8_t* src, int64_t n_blocks, int8_t* values, int* exponents);

// One K-quant super-block: 256 finite floats into the type's block (ggml_kquant_encode.cc).

void EncodeQ2_K(const float* x, uint8_t* block);
void EncodeQ3_K(const float* x, uint8_t* block);
void EncodeQ4_K(const float* x, uint8_t* block);
void EncodeQ5_K(const float* x, uint8_t* block);
void EncodeQ6_K(const float* x, uint8_t* block);

}  // namespace strata::gguf::internal

#endif  // STRATA_ENGINE_GGUF_GGML_QUANTS_H_
