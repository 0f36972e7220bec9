#!/usr/bin/env bash
# Builds fp8proj (Release; CUDA when the toolkit is present) and runs every test. GPU tests
# report themselves skipped, with the reason, where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
source scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$FP8PROJ_JOBS"
ctest --test-dir build --output-on-failure -j "$FP8PROJ_JOBS"
