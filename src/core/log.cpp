#include "fp8proj/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>

#include "fp8proj/env.hpp"
#include "fp8proj/error.hpp"

namespace fp8proj {

namespace {
LogLevel parse_level(const std::string& s) {
  if (s == "error") return LogLevel::error;
  if (s == "warn") return LogLevel::warn;
  if (s == "debug") return LogLevel::debug;
  return LogLevel::info;
}

int initial_level() {
  try {
    return static_cast<int>(parse_level(env::log_level().value_or("info")));
  } catch (const Error& e) {  // a bad knob must not turn every log call into an exception
    std::fprintf(stderr, "[fp8proj warn] %s; using info\n", e.what());
    return static_cast<int>(LogLevel::info);
  }
}

std::atomic<int>& level_slot() {
  static std::atomic<int> level{initial_level()};
  return level;
}

std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}

const char* tag(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "";
}
}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_slot().load()); }
void set_log_level(LogLevel level) { level_slot().store(static_cast<int>(level)); }

void log(LogLevel level, std::string_view message) {
  if (static_cast<int>(level) > level_slot().load()) return;
  std::lock_guard<std::mutex> lock(log_mutex());
  std::fprintf(stderr, "[fp8proj %s] %.*s\n", tag(level), static_cast<int>(message.size()), message.data());
}

bool log_once(LogLevel level, const std::string& key, std::string_view message) {
  static std::set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(log_mutex());
    if (!seen.insert(key).second) return false;
  }
  log(level, message);
  return true;
}

}  // namespace fp8proj
