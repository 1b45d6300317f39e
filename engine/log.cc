#include "engine/log.h"

#include "absl/synchronization/mutex.h"

#include <string>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace strata {

void InitLogging(std::string_view level) {
  auto logger = spdlog::stderr_color_mt("strata");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(std::string(level)));
  spdlog::set_default_logger(logger);
}

void TurnOffMutexDeadlockDetection() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace strata
