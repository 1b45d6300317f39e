#ifndef STRATA_ENGINE_MODEL_PREFETCH_GATE_H_
#define STRATA_ENGINE_MODEL_PREFETCH_GATE_H_

// Whether the offload tier's copies ahead pay. A layer's routing is guessed one layer early (RoutingGuess)
// and its likely misses copied into VRAM while the GPU is busy with the layer before; a copy of a wrongly
// guessed expert takes the PCIe time that a right one saves, so copies run only while at least `min_right` of
// the guessed experts turn out routed. The guesses go on being made and counted while copies are off, so the
// gate opens again when routing becomes predictable. Counts decay (halved once `window` guesses gathered), so
// the gate follows the recent traffic. Not thread-safe: the scheduler's.

#include <cstdint>

namespace strata::model {

class PrefetchGate {
 public:
  // max_experts: the experts a layer copies ahead when open (0: never). Opens below min_right + hysteresis
  // only from at least that much, so that one noisy window does not flap it.
  explicit PrefetchGate(int max_experts, double min_right = 0.5, int64_t window = 1024);

  // A step's guessed experts and how many of them were routed; returns limit().
  int Observe(uint64_t guessed, uint64_t right);
  // The experts a layer copies ahead now: max_experts while open, else 0.
  int limit() const { return open_ ? max_experts_ : 0; }
  double right_fraction() const;

 private:
  static constexpr double kHysteresis = 0.05;
  static constexpr uint64_t kMinSample = 64;  // guesses before the first decision
  int max_experts_;
  double min_right_;
  uint64_t window_;
  double guessed_ = 0, right_ = 0;
  bool open_ = true;
};

}  // namespace strata::model

#endif  // STRATA_ENGINE_MODEL_PREFETCH_GATE_H_
