// The one logging facade (spdlog underneath). Lifecycle events at INFO with key=value fields;
// nothing logs per token. Example: GLM_LOG_INFO("agent started addr={} node={}", addr, node);
#pragma once

#include <string_view>

#include "spdlog/spdlog.h"

namespace glm {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

// Configures the process logger: `program` prefixes each line; logs go to stderr and into
// ProcessLogRing() (common/log_ring.h), the last lines the daemons serve through their Logs RPC.
void InitLogging(std::string_view program, LogLevel level = LogLevel::kInfo);

// Parses "debug" | "info" | "warn" | "error"; anything else yields kInfo.
LogLevel ParseLogLevel(std::string_view name);

}  // namespace glm

#define GLM_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define GLM_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define GLM_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define GLM_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
