#!/bin/bash
# Session 14, call 8: the 4096x2048 bucket M 33-64 across its range (M = 40, 48, 64): the table
# as it lands (S14: m64n32_ws1_st15) against session 13's (S13: m64n64_ws1_st12), both
# orientations (libraries swapped), 3 runs each; same SASS on both sides.
cd "$(dirname "$0")/../../../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/exp/libfp8proj_c_exp.so.xz > .device/libfp8proj_c_exp.so && chmod +x .device/libfp8proj_c_exp.so
E=$PWD/build-pack/exp
for o in NO ON; do
  a=$E/table_s14.json; b=$E/table_s13.json
  [ $o = ON ] && { a=$E/table_s13.json; b=$E/table_s14.json; }
  mkdir -p $OUT/$o && OUT=$OUT/$o FP8PROJ_TUNE_FILE=$a FP8PROJ_TUNE_FILE_EXP=$b FP8PROJ_C_LIB_B=$PWD/.device/libfp8proj_c_exp.so RUNS=3 \
    COMPARE_ARGS="--reps 45 --only 4096,2048 --m 40,48,64" timeout 200 bash scripts/h200_deepgemm.sh > $OUT/$o/dg.log 2>&1; echo "$o rc $?"
  grep -E "M=    [0-9]+:" $OUT/$o/dg.log | sed 's/  err.*B / B /'
  mv $OUT/$o/deepgemm_compare.tgz $OUT/compare_$o.tgz; rm -rf $OUT/$o/run* $OUT/$o/prewarm
done
