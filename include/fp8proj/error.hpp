// One error vocabulary for the whole library: every check throws fp8proj::Error
// carrying file:line and a message that says what was wrong and what to do.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fp8proj {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& what);
// "what [src/layer/projection.cpp:12]": the message with its source location, as throw_error
// shows it (the path from the project's top folder on).
std::string located(const char* file, int line, const std::string& what);

// Streams any number of printable values into one string.
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace fp8proj

// FP8PROJ_CHECK(cond, "message parts", value, ...): throws fp8proj::Error when cond is false.
#define FP8PROJ_CHECK(cond, ...)                                                       \
  do {                                                                                 \
    if (!(cond)) [[unlikely]]                                                          \
      ::fp8proj::detail::throw_error(__FILE__, __LINE__,                               \
                                     ::fp8proj::detail::concat(__VA_ARGS__));          \
  } while (0)

#define FP8PROJ_FAIL(...) \
  ::fp8proj::detail::throw_error(__FILE__, __LINE__, ::fp8proj::detail::concat(__VA_ARGS__))
