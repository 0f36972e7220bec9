#!/bin/bash
# (The tables live in build-pack/s16/, outside the repository; their differences: tables_tried.md.)
# Session 16, call 6: a table A/B in the DeepGEMM comparison, the landed library (964cad7) for
# both: A = configs/nvidia-h200.json, B = tableD.json (7 buckets at M = 128/256: narrower 1d2d
# tiles, two waves instead of one, as m64n48 at M = 64 on the N = 6144 shapes in call 3).
# Both ways round; M = 64 and the unchanged M = 256 points are controls.
cd "$(dirname "$0")/../.."
tar xJf build-pack/s16/bundle_final.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
mkdir -p $OUT/ab
L=$PWD/.device/lib/libfp8proj_c.so
OUT=$OUT/ab FP8PROJ_C_LIB=$L FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json \
  FP8PROJ_C_LIB_B=$L FP8PROJ_TUNE_FILE_B=$PWD/build-pack/s16/tableD.json AB_BOTH_WAYS=1 RUNS=2 \
  COMPARE_ARGS="--reps 45 --m 64,128,256" timeout 400 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1
echo "rc $?"; cat $OUT/ab/ab_both_ways.md
cd $OUT && tar czf ab.tgz ab && rm -rf ab
