#!/bin/bash
# Session 17, call 1: main (kernels and table of 964cad7; the binaries validated in session 16,
# call 5, carried again) in the DeepGEMM comparison over DESIGN.md's 66 points, three runs: fresh
# samples of DeepGEMM's own ratio for scripts/deepgemm_spread.py, and this session's numbers.
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
tar xJf build-pack/s16/bundle_final.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
mkdir -p $OUT/cmp
OUT=$OUT/cmp FP8PROJ_C_LIB=$PWD/.device/lib/libfp8proj_c.so FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json RUNS=3 \
  COMPARE_ARGS="--reps 45" timeout 540 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1
echo "rc $?"; grep -E "^Same run|^Against DESIGN|^Largest|Peak|peak" $OUT/cmp/run*/compare_deepgemm.md
rm -f $OUT/cmp/deepgemm_compare.tgz $OUT/cmp/*.so $OUT/cmp/run*/*.so
cd $OUT && tar czf cmp.tgz cmp && rm -rf cmp
