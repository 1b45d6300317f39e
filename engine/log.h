#ifndef STRATA_ENGINE_LOG_H_
#define STRATA_ENGINE_LOG_H_

// Strata logs through spdlog everywhere (Abseil 20220623 has no absl/log). Use the spdlog macros
// (spdlog::info, spdlog::warn, spdlog::error) directly; this header only fixes the process-wide setup.

#include <string_view>

#include "spdlog/spdlog.h"

namespace strata {

// Sets the default logger to stderr with the level named by `level` ("debug", "info", "warn", "error",
// "off"). Binaries call it once from main(); tests and libraries never do.
void InitLogging(std::string_view level);

// Turns off absl::Mutex's deadlock detection, a lock-order graph update on every acquisition, which
// Debian's Abseil (built without NDEBUG) leaves on. Binaries and benchmarks call it first thing; the
// tests keep the detection.
void TurnOffMutexDeadlockDetection();

}  // namespace strata

#endif  // STRATA_ENGINE_LOG_H_
