#!/bin/bash
# Session 16, call 5: main as landed (964cad7), binaries built from it on the build machine and
# carried: C API tests, GPU tests, CPU tests, harness --quick, the correctness sweep, verify,
# sanitizers; then the DeepGEMM comparison over DESIGN.md's 66 points, two runs.
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
tar xJf build-pack/s16/bundle_final.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
timeout 60 .device/bin/fp8proj_c_api_tests --gtest_brief=1 > $OUT/c_api.log 2>&1; echo "c_api rc=$? $(tail -n 2 $OUT/c_api.log | tr '\n' ' ')"
H200_BUDGET_S=240 bash scripts/h200.sh info tests harness correctness verify sanitize 2>&1 | grep "^\[h200"
mkdir -p $OUT/cmp
OUT=$OUT/cmp FP8PROJ_C_LIB=$PWD/.device/lib/libfp8proj_c.so FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json RUNS=2 \
  COMPARE_ARGS="--reps 45" timeout 330 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1
echo "rc $?"; grep -E "^Same run|^Against DESIGN|^Largest|Peak|peak" $OUT/cmp/run*/compare_deepgemm.md
cd $OUT && tar czf cmp.tgz cmp && rm -rf cmp
