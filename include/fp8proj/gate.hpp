// The path decision moved into the selection (selection.hpp: Path, Fp8Policy, the thresholds
// and the chain); this header stays for code that includes it.
#pragma once

#include "fp8proj/selection.hpp"
