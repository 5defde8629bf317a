#include "common/logging.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/log_ring.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace glm {
namespace {

// Feeds every line the logger writes into a LogRing, formatted by the logger's pattern (color
// markers have no effect outside a color sink).
class LogRingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit LogRingSink(LogRing* ring) : ring_(ring) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    ring_->Append(std::string_view(formatted.data(), formatted.size()));
  }
  void flush_() override {}

 private:
  LogRing* const ring_;
};

}  // namespace

void InitLogging(std::string_view program, LogLevel level) {
  // stderr as before, plus the process's in-memory ring (Agent.Logs / Controller.Logs). Not
  // registered by name, so a second call (tests) replaces the default logger instead of throwing.
  std::vector<spdlog::sink_ptr> sinks = {
      std::make_shared<spdlog::sinks::stderr_color_sink_mt>(),
      std::make_shared<LogRingSink>(&ProcessLogRing())};
  auto logger = std::make_shared<spdlog::logger>(std::string(program), sinks.begin(), sinks.end());
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
