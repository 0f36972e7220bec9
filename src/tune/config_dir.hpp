// Internal: where the shipped tuned tables (share/fp8proj/configs/<gpu>.json) are looked for.
#pragma once

#include <string>
#include <vector>

namespace fp8proj {

// In order: share/fp8proj/configs next to the module (executable or shared library) holding
// this code -- <module dir>/../share/... for an installed bin/ or lib/, and up to two levels
// further up, which finds the build tree's share/fp8proj/configs (a link to the source
// configs/ made at configure time) from build/tools/fp8proj/ or build/tests/ -- then the
// install prefix the library was configured with. No source-tree path is compiled in.
std::vector<std::string> tune_table_dirs();

}  // namespace fp8proj
