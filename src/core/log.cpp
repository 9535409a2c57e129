// Logging: one line per message, serialized with a mutex so threads never interleave a line.
#include "core/log.h"

#include "core/env.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace nibble {
namespace {

LogLevel threshold_from_env() {
  const char* env = env_value("NIBBLE_LOG");
  const std::string level = env ? env : "info";
  if (level == "debug") return LogLevel::DEBUG;
  if (level == "warn") return LogLevel::WARN;
  if (level == "error") return LogLevel::ERROR;
  return LogLevel::INFO;
}

}  // namespace

void log(LogLevel level, std::string_view message) {
  static const LogLevel threshold = threshold_from_env();
  static std::mutex mutex;
  if (level < threshold) return;
  static constexpr const char* NAMES[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[nibble %s] %.*s\n", NAMES[static_cast<int>(level)], static_cast<int>(message.size()),
               message.data());
}

}  // namespace nibble
