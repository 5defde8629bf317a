#include "common/logging.h"

#include <string>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace glm {

void InitLogging(std::string_view program, LogLevel level) {
  auto logger = spdlog::stderr_color_mt(std::string(program));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n: %v");
  switch (level) {
    case LogLevel::kDebug: logger->set_level(spdlog::level::debug); break;
    case LogLevel::kInfo: logger->set_level(spdlog::level::info); break;
    case LogLevel::kWarn: logger->set_level(spdlog::level::warn); break;
    case LogLevel::kError: logger->set_level(spdlog::level::err); break;
  }
  spdlog::set_default_logger(logger);
}

LogLevel ParseLogLevel(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

}  // namespace glm
