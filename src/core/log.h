// Minimal leveled logging to stderr; the level comes from NIBBLE_LOG (debug|info|warn|error).
#pragma once

#include <string_view>

namespace nibble {

enum class LogLevel { DEBUG, INFO, WARN, ERROR };

void log(LogLevel level, std::string_view message);
inline void log_debug(std::string_view m) { log(LogLevel::DEBUG, m); }
inline void log_info(std::string_view m) { log(LogLevel::INFO, m); }
inline void log_warn(std::string_view m) { log(LogLevel::WARN, m); }
inline void log_error(std::string_view m) { log(LogLevel::ERROR, m); }

}  // namespace nibble
