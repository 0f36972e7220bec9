#!/bin/bash
# Session 14, call 5: call 4 with the two builds' places swapped, to separate the code from the
# placement of each library's weight copy (call 4 showed B 1-2% slower at M = 16 on shapes whose
# swap-AB SASS is byte-identical in A and B). (1) A = early4 (1d2d hand-over), B = main, M <= 256,
# 3 runs. (2) A = main's library reading the m64n32 table, B = the same SASS reading main's table
# (FP8PROJ_TUNE_FILE_EXP), 4096x2048, M = 16, 64, 128, 3 runs.
cd "$(dirname "$0")/../../../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
tar xJf build-pack/exp/early4.txz -C .device
xz -dc build-pack/exp/libfp8proj_c_exp.so.xz > .device/libfp8proj_c_exp.so && chmod +x .device/libfp8proj_c_exp.so
FP8PROJ_C_LIB=$PWD/.device/early/lib/libfp8proj_c.so FP8PROJ_C_LIB_B=$PWD/.device/lib/libfp8proj_c.so RUNS=3 \
  COMPARE_ARGS="--reps 45 --m 16,64,128,256" timeout 300 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "dg rc $?"
grep -E "^Build B" $OUT/dg.log
mkdir -p $OUT/t && OUT=$OUT/t FP8PROJ_TUNE_FILE=$PWD/build-pack/exp/table_m64n32.json FP8PROJ_TUNE_FILE_EXP=$PWD/configs/nvidia-h200.json \
  FP8PROJ_C_LIB_B=$PWD/.device/libfp8proj_c_exp.so RUNS=3 \
  COMPARE_ARGS="--reps 45 --only 4096,2048 --m 16,64,128" timeout 200 bash scripts/h200_deepgemm.sh > $OUT/t/dg_table.log 2>&1; echo "dg table rc $?"
grep -E "M=    64|^Build B" $OUT/t/dg_table.log
cp $OUT/t/deepgemm_compare.tgz $OUT/table_compare.tgz; rm -rf $OUT/t/run* $OUT/t/prewarm
