#!/bin/bash
# Session 14, call 6: table experiment at M = 16, both orientations (the library holding each
# table swapped between them: call 5 showed each library's weight copy carries its own 1-3% at
# memory-bound points). N = table_new (main + m64n32_ws1_st15 at 4096x2048, M 33-64),
# X = N + at M <= 16: 4096x2048 m64n32_ws1_st15 (DeepGEMM's 1d2d 16x32 shape, ours 64 rows),
# 7168x16384 swapab_m32n128_ws2_st10 and 24576x1536 swapab_m16n64_ws2_st15 (the tuner's session-13
# picks that session 13 set aside on an unbalanced A/B). Same SASS on both sides (main's
# library; the B side reads its table through FP8PROJ_TUNE_FILE_EXP). 3 runs each way.
cd "$(dirname "$0")/../../../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/exp/libfp8proj_c_exp.so.xz > .device/libfp8proj_c_exp.so && chmod +x .device/libfp8proj_c_exp.so
E=$PWD/build-pack/exp
for o in NX XN; do
  a=$E/table_new.json; b=$E/table_m16exp.json
  [ $o = XN ] && { a=$E/table_m16exp.json; b=$E/table_new.json; }
  mkdir -p $OUT/$o && OUT=$OUT/$o FP8PROJ_TUNE_FILE=$a FP8PROJ_TUNE_FILE_EXP=$b FP8PROJ_C_LIB_B=$PWD/.device/libfp8proj_c_exp.so RUNS=3 \
    COMPARE_ARGS="--reps 45 --m 16,64" timeout 250 bash scripts/h200_deepgemm.sh > $OUT/$o/dg.log 2>&1; echo "$o rc $?"
  grep -E "^Build B" $OUT/$o/dg.log
  mv $OUT/$o/deepgemm_compare.tgz $OUT/compare_$o.tgz; rm -rf $OUT/$o/run* $OUT/$o/prewarm
done
