#ifndef STRATA_TESTS_TESTING_REFERENCE_DEEPSEEK2_H_
#define STRATA_TESTS_TESTING_REFERENCE_DEEPSEEK2_H_

// The reference model's deepseek2 pieces (reference_deepseek2.cc) and the plain helpers they share with
// reference_model.cc. Internal to the reference model.

#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/gguf/gguf_file.h"
#include "tests/testing/reference_model.h"

namespace strata::testing::reference_internal {

// y = m x, accumulated in double.
std::vector<float> MatVec(const ReferenceModel::Matrix& m, std::span<const float> x);
// x / sqrt(mean(x^2) + eps) * weight, in place.
void RmsNorm(std::span<float> x, const std::vector<float>& weight, double eps);

// Reads deepseek2's own keys into `hp` (the generic ones already read); errors name `path` and the key.
absl::Status ReadDeepseek2Hparams(const gguf::Metadata& md, const std::string& path, ReferenceModel::Hparams* hp);

// Latent attention of one block for positions 0..h.size()-1 (h: the attn_norm'd inputs), after attn_output.
std::vector<std::vector<float>> LatentAttention(const ReferenceModel::Hparams& hp, const ReferenceModel::Layer& layer,
                                                const std::vector<std::vector<float>>& h);

// Leaves in `choice` only the experts of the n_group_used best groups (the others set to -infinity).
void KeepBestGroups(const ReferenceModel::Hparams& hp, std::vector<double>* choice);

}  // namespace strata::testing::reference_internal

#endif  // STRATA_TESTS_TESTING_REFERENCE_DEEPSEEK2_H_
