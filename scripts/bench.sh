#!/usr/bin/env bash
# Builds fp8proj and runs the main job: `fp8proj bench` with its defaults — on the GPU when
# one is present (GLM-5 and DeepSeek-V3 shapes, TP 1 and 4, M from 1 to 32768), otherwise the
# CPU reference at small sizes. Extra arguments go to `fp8proj bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
source scripts/env.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$FP8PROJ_JOBS" --target fp8proj_cli
./build/tools/fp8proj/fp8proj bench "$@"
