#include "tune/config_dir.hpp"

#include <dlfcn.h>

#include <filesystem>

namespace fp8proj {

namespace {
void anchor() {}  // an address inside the module that holds this library's code
}  // namespace

std::vector<std::string> tune_table_dirs() {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&anchor), &info) != 0 && info.dli_fname && *info.dli_fname) {
    std::error_code ec;
    fs::path dir = fs::weakly_canonical(fs::path(info.dli_fname), ec).parent_path();
    for (int up = 0; up < 3 && !dir.empty(); ++up, dir = dir.parent_path()) {
      dirs.push_back((dir.parent_path() / "share" / "fp8proj" / "configs").string());
      if (dir == dir.parent_path()) break;
    }
  }
#ifdef FP8PROJ_INSTALL_PREFIX
  dirs.push_back((fs::path(FP8PROJ_INSTALL_PREFIX) / "share" / "fp8proj" / "configs").string());
#endif
  return dirs;
}

}  // namespace fp8proj
