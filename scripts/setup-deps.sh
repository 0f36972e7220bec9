#!/usr/bin/env bash
# Installs what building and testing fp8proj needs on Debian 12 / Ubuntu: the Debian packages
# (CLI11, nlohmann-json, fmt, OpenBLAS, GoogleTest, Google Benchmark, CMake) and, from PyPI,
# numpy + ml_dtypes (the independent FP8 oracle) and safetensors (fixtures); for the Python
# package, torch (only when missing: it is large), pytest, transformers and scikit-build-core;
# ccache, which scripts/test.sh uses as the compiler launcher when present. The CUDA toolkit
# is used when present (nvcc on PATH or in /usr/local/cuda); it is not installed here.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# clang-14 + libclang-rt-14-dev: the ASan+UBSan build and the libFuzzer targets (tests/sanitize).
packages=(cmake g++ make git python3 python3-pip libcli11-dev nlohmann-json3-dev libfmt-dev libopenblas-dev
          libgtest-dev libbenchmark-dev ccache clang-14 libclang-rt-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# nvidia-cuda-cuobjdump/-nvdisasm: the SASS and resource-usage check of the kernels
# (tests/kernels/check_kernels.py) where the toolkit ships no cuobjdump.
pymods=(numpy ml_dtypes safetensors nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)
have_py() {
  python3 - <<'PY' 2>/dev/null
import glob, shutil, sys, sysconfig
import ml_dtypes, numpy, safetensors  # noqa: F401
cuobjdump = shutil.which("cuobjdump") or glob.glob(sysconfig.get_paths()["purelib"] + "/nvidia/*/bin/cuobjdump")
sys.exit(0 if cuobjdump else 1)
PY
}
if ! have_py; then
  echo "[setup] pip install ${pymods[*]}"
  python3 -m pip install --quiet "${pymods[@]}" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "${pymods[@]}"
fi

# The Python package's build and tests. torch is installed only when missing (a GPU machine
# brings its own build).
pip_install() {
  python3 -m pip install --quiet "$@" 2>/dev/null || python3 -m pip install --quiet --break-system-packages "$@"
}
python3 -c "import torch" 2>/dev/null || { echo "[setup] pip install torch"; pip_install torch; }
if ! python3 -c "import pytest, transformers, scikit_build_core" 2>/dev/null; then
  echo "[setup] pip install pytest transformers scikit-build-core"
  pip_install pytest "transformers>=5" scikit-build-core
fi
