// Minimal logging to stderr with the "[fp8proj]" prefix. The level comes from
// FP8PROJ_LOG_LEVEL (error | warn | info | debug; default info). log_once() prints a
// message the first time its key is seen: fallbacks to a slower path say so exactly once.
#pragma once

#include <string>
#include <string_view>

namespace fp8proj {

enum class LogLevel : int { error = 0, warn = 1, info = 2, debug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log(LogLevel level, std::string_view message);
// Returns true if this call printed (the key had not been seen before).
bool log_once(LogLevel level, const std::string& key, std::string_view message);

}  // namespace fp8proj
