# Sourced by the scripts: puts the CUDA toolkit on PATH when it is installed but not found.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
FP8PROJ_JOBS="${FP8PROJ_JOBS:-$(nproc)}"
