#include "fp8proj/error.hpp"

#include <cstring>

namespace fp8proj::detail {

std::string located(const char* file, int line, const std::string& what) {
  // Keep the path short: "src/layer/projection.cpp" rather than the build machine's absolute path.
  const char* shown = file;
  for (const char* marker : {"/src/", "/include/", "/tools/", "/tests/", "/bench/"}) {
    if (const char* p = std::strstr(file, marker)) {
      shown = p + 1;
      break;
    }
  }
  return concat(what, " [", shown, ":", line, "]");
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& what) {
  throw Error("fp8proj: " + located(file, line, what));
}

}  // namespace fp8proj::detail
