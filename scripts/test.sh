#!/usr/bin/env bash
# Builds fp8proj (Release; CUDA when the toolkit is present) and runs every test. GPU tests
# report themselves skipped, with the reason, where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
source scripts/env.sh
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
fi
export CMAKE_GENERATOR="${CMAKE_GENERATOR:-Unix Makefiles}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$FP8PROJ_JOBS"
ctest --test-dir build --output-on-failure -j "$FP8PROJ_JOBS"
# The Python package (pyproject.toml) and its tests; GPU tests skip with the reason. pip builds
# libfp8proj_c in build-python/, a sibling of build/ with the same generator, so every compile
# line is the same relative to its directory and ccache serves the objects build/ made.
pip_install() {
  CMAKE_BUILD_PARALLEL_LEVEL="$FP8PROJ_JOBS" python3 -m pip install --quiet --no-build-isolation "$@" ||
    CMAKE_BUILD_PARALLEL_LEVEL="$FP8PROJ_JOBS" python3 -m pip install --quiet --no-build-isolation \
      --break-system-packages "$@"
}
pip_install -C build-dir=build-python .
python3 -m pytest -q -rs python/tests
