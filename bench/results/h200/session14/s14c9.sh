#!/bin/bash
# Session 14, call 9: scripts/h200_deepgemm.sh's AB_BOTH_WAYS=1 on the H200 (4 runs, the two
# libraries' places swapped every other run), used for a table experiment at M = 2048: X = main
# (library of this tree's SASS, configs/nvidia-h200.json), Y = the same SASS reading
# table_y_m2048.json through FP8PROJ_TUNE_FILE_EXP (m256n128_ws2_st3 at 16384x2048 and 6144x16384,
# M 1025-2048: DeepGEMM's 256x128 shape there, without its cluster). M = 16 points: controls.
cd "$(dirname "$0")/../../../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/exp/libfp8proj_c_exp.so.xz > .device/libfp8proj_c_exp.so && chmod +x .device/libfp8proj_c_exp.so
FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json FP8PROJ_TUNE_FILE_EXP=$PWD/build-pack/exp/table_y_m2048.json \
  FP8PROJ_C_LIB_B=$PWD/.device/libfp8proj_c_exp.so AB_BOTH_WAYS=1 RUNS=4 COMPARE_ARGS="--reps 45 --m 16,2048" \
  timeout 400 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "dg rc $?"
cat $OUT/ab_both_ways.md
