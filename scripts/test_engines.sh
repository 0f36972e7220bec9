#!/usr/bin/env bash
# The engine plugin tests (python/tests/engines/) against the released SGLang and vLLM.
#
#   scripts/test_engines.sh [sglang|vllm ...]      # default: both
#
# For each engine: a throwaway venv ($FP8PROJ_ENGINE_VENVS/venv-<engine>, default /tmp), the
# released engine from PyPI (it pulls its own torch, several GB), pytest, and this repository's
# package, installed from a wheel built once from the repository root (`pip wheel .`: it builds
# libfp8proj_c.so with CMake; CPU-only where there is no GPU). Then pytest on the engine's test
# file, with the driver JSON (the layers each model definition tags and skips) and the log kept
# under bench/results/engine-plugins/ (or $FP8PROJ_ENGINE_RESULTS).
# The engines' CPU paths, plus, where a Hopper GPU and the engine's CUDA packages are present,
# the SGLang FP8-checkpoint test's GPU half (test_fp8_checkpoint_apply_on_gpu; skipped elsewhere).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SGLANG_VERSION=${FP8PROJ_SGLANG_VERSION:-0.5.23}
VLLM_VERSION=${FP8PROJ_VLLM_VERSION:-0.33.0}
VENVS=${FP8PROJ_ENGINE_VENVS:-/tmp}
RESULTS=${FP8PROJ_ENGINE_RESULTS:-$ROOT/bench/results/engine-plugins}
ENGINES=("$@")
[ ${#ENGINES[@]} -gt 0 ] || ENGINES=(sglang vllm)
mkdir -p "$RESULTS"

wheel_dir=$(mktemp -d /tmp/fp8proj-wheel.XXXXXX)
# The tests run the engines on the CPU: a CUDA build of the library only where a GPU is present.
cmake_args=()
nvidia-smi -L >/dev/null 2>&1 || cmake_args=(-C cmake.define.FP8PROJ_CUDA=OFF)
echo "== building the fp8proj wheel from $ROOT"
python3 -m pip wheel "$ROOT" --no-deps -w "$wheel_dir" "${cmake_args[@]}" -q
wheel=$(ls "$wheel_dir"/fp8proj-*.whl)

status=0
for engine in "${ENGINES[@]}"; do
  case "$engine" in
    sglang) spec="sglang==$SGLANG_VERSION" ;;
    vllm) spec="vllm==$VLLM_VERSION" ;;
    *) echo "unknown engine '$engine' (sglang, vllm)" >&2; exit 2 ;;
  esac
  venv="$VENVS/venv-$engine"
  echo "== $engine: $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q "$spec" pytest
  # --no-deps: fp8proj needs only torch, which the engine pinned; keep its torch.
  "$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel"
  log="$RESULTS/test-$engine.log"
  {
    echo "# $("$venv/bin/python" -c "import $engine, torch, fp8proj; print('$engine', $engine.__version__, '| torch', torch.__version__, '| fp8proj', fp8proj.__version__)")"
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -m), $(nproc) CPUs, $(nvidia-smi -L 2>/dev/null | head -1 || true)" | sed 's/, $/, no GPU used/'
  } > "$log"
  (cd "$ROOT" && FP8PROJ_ENGINE_RESULTS="$RESULTS/json" \
     "$venv/bin/python" -m pytest -v -rs -p no:cacheprovider \
       "python/tests/engines/test_${engine}_plugin.py") 2>&1 | tee -a "$log" || status=1
done
rm -rf "$wheel_dir"
python3 "$ROOT/python/tests/engines/summarize.py" "$RESULTS" && echo "== layer lists: $RESULTS/layers.md"
exit $status
