#!/usr/bin/env bash
# Builds fp8proj (Release; CUDA when the toolkit is present) and runs every test. GPU tests
# report themselves skipped, with the reason, where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
source scripts/env.sh
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="$PWD"
fi
# One build tree serves the C++ tests and the Python package: pip (scikit-build-core) configures
# build/ again with FP8PROJ_TESTS=OFF and builds only libfp8proj_c, already up to date, so the
# generator must match and FP8PROJ_TESTS is set explicitly here.
export CMAKE_GENERATOR="${CMAKE_GENERATOR:-Unix Makefiles}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFP8PROJ_TESTS=ON
cmake --build build -j "$FP8PROJ_JOBS"
ctest --test-dir build --output-on-failure -j "$FP8PROJ_JOBS"
# The Python package (pyproject.toml) and its tests; GPU tests skip with the reason.
CMAKE_BUILD_PARALLEL_LEVEL="$FP8PROJ_JOBS" python3 -m pip install --quiet --no-build-isolation -C build-dir=build . ||
  CMAKE_BUILD_PARALLEL_LEVEL="$FP8PROJ_JOBS" python3 -m pip install --quiet --no-build-isolation --break-system-packages \
    -C build-dir=build .
python3 -m pytest -q -rs python/tests
