#!/bin/bash
# Session 14, call 10: AB_BOTH_WAYS=1, 4 runs: X = main, Y = the same SASS with m256n128_ws2_st3
# (DeepGEMM's 256x128 shape, without its cluster) instead of m128n192_ws2_st4 at 4096x2048,
# M 4097-32768 (N = 4096 is not a multiple of 192).
cd "$(dirname "$0")/../../../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/exp/libfp8proj_c_exp.so.xz > .device/libfp8proj_c_exp.so && chmod +x .device/libfp8proj_c_exp.so
FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json FP8PROJ_TUNE_FILE_EXP=$PWD/build-pack/exp/table_y_4096large.json \
  FP8PROJ_C_LIB_B=$PWD/.device/libfp8proj_c_exp.so AB_BOTH_WAYS=1 RUNS=4 COMPARE_ARGS="--reps 45 --only 4096,2048 --m 8192,16384,32768" \
  timeout 200 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "dg rc $?"
cat $OUT/ab_both_ways.md
