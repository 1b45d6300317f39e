#include "engine/model/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace strata::model {

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

std::vector<double> RopeFrequencies(int64_t rope_dim, float freq_base) {
  std::vector<double> frequencies(static_cast<size_t>(rope_dim / 2));
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    frequencies[i] = std::pow(static_cast<double>(freq_base), -2.0 * i / rope_dim);
  }
  return frequencies;
}

std::vector<double> YarnFrequencies(int64_t rope_dim, float freq_base, const RopeYarn& yarn) {
  std::vector<double> frequencies = RopeFrequencies(rope_dim, freq_base);
  const double n_dims = static_cast<double>(rope_dim), base = freq_base;
  auto corr_dim = [&](double n_rot) {
    return n_dims * std::log(static_cast<double>(yarn.original_context) / (n_rot * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(corr_dim(yarn.beta_fast)));
  const double high = std::min(n_dims - 1.0, std::ceil(corr_dim(yarn.beta_slow)));
  for (size_t i = 0; i < frequencies.size(); ++i) {
    const double y = (static_cast<double>(i) - low) / std::max(0.001, high - low);
    const double ramp = 1.0 - std::min(1.0, std::max(0.0, y));
    frequencies[i] *= (1.0 - ramp) / yarn.factor + ramp;
  }
  return frequencies;
}

float YarnMagnitude(const RopeYarn& yarn) {
  if (!yarn.rotation_magnitude) return 1.0f;
  return yarn.attn_factor * (1.0f + 0.1f * std::log(yarn.factor));
}

void RopeAngles(std::span<const double> frequencies, int64_t pos, float* cos, float* sin, float magnitude) {
  for (size_t i = 0; i < frequencies.size(); ++i) {
    const double theta = static_cast<double>(pos) * frequencies[i];
    cos[i] = static_cast<float>(std::cos(theta)) * magnitude;
    sin[i] = static_cast<float>(std::sin(theta)) * magnitude;
  }
}

void Rope(float* head, int64_t rope_dim, const float* cos, const float* sin, RopeStyle style) {
  const int64_t half = rope_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = style == RopeStyle::kNeox ? i : 2 * i;
    const int64_t b = style == RopeStyle::kNeox ? i + half : 2 * i + 1;
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * cos[i] - x1 * sin[i];
    head[b] = x0 * sin[i] + x1 * cos[i];
  }
}

void AddBias(float* x, const float* bias, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += bias[i];
}

float Dot(const float* a, const float* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

void Softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void TopK(const float* x, int64_t n, int64_t k, int32_t* ids) {
  // k is small (<= a few dozen): selection by insertion keeps it allocation-free.
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (count == k && !(x[i] > x[ids[k - 1]])) continue;
    int64_t j = count < k ? count++ : k - 1;
    while (j > 0 && x[i] > x[ids[j - 1]]) {
      ids[j] = ids[j - 1];
      --j;
    }
    ids[j] = static_cast<int32_t>(i);
  }
}

void MaskAllButBestGroups(float* scores, int64_t n, int64_t n_group, int64_t n_group_used, GroupScore how) {
  if (n_group <= 1 || n_group_used >= n_group) return;
  const int64_t per_group = n / n_group;
  thread_local std::vector<float> group_scores;
  thread_local std::vector<int32_t> best;
  group_scores.resize(static_cast<size_t>(n_group));
  best.resize(static_cast<size_t>(n_group_used));
  for (int64_t g = 0; g < n_group; ++g) {
    const float* s = scores + g * per_group;
    float first = -INFINITY, second = -INFINITY;
    for (int64_t i = 0; i < per_group; ++i) {
      if (s[i] > first) {
        second = first;
        first = s[i];
      } else if (s[i] > second) {
        second = s[i];
      }
    }
    group_scores[g] = how == GroupScore::kMax ? first : first + second;
  }
  TopK(group_scores.data(), n_group, n_group_used, best.data());
  for (int64_t g = 0; g < n_group; ++g) {
    if (std::find(best.begin(), best.end(), static_cast<int32_t>(g)) != best.end()) continue;
    std::fill(scores + g * per_group, scores + (g + 1) * per_group, -INFINITY);
  }
}

}  // namespace strata::model
