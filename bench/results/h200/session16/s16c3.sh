#!/bin/bash
# (The tables live in build-pack/s16/, outside the repository; their differences: tables_tried.md.)
# Session 16, call 3: a table A/B in the DeepGEMM comparison, same library for both (session 15's
# main, libMain.so): A = configs/nvidia-h200.json, B = tableC.json (9 small-M buckets: more CTAs
# on the weight stream -- swap-AB 64-row weight tiles at M = 16, narrower 1d2d tiles at M = 64).
# Both ways round; M = 128, 256 are controls. Then Nsight Compute of DeepGEMM's and our kernel at
# 6144x16384, M = 4096 (A's table: our 128x192; DeepGEMM's 256x128 2-CTA cluster), clocks alone.
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
tar xJf build-pack/s16/bundle_s16.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/s16/libMain.so.xz > .device/libMain.so; chmod +x .device/libMain.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
mkdir -p $OUT/ab
OUT=$OUT/ab FP8PROJ_C_LIB=$PWD/.device/libMain.so FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json \
  FP8PROJ_C_LIB_B=$PWD/.device/libMain.so FP8PROJ_TUNE_FILE_B=$PWD/build-pack/s16/tableC.json AB_BOTH_WAYS=1 RUNS=2 NCU_PROBLEM=6144,16384,4096 \
  COMPARE_ARGS="--reps 45 --m 16,64,128,256" timeout 540 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1
echo "rc $?"; cat $OUT/ab/ab_both_ways.md
cd $OUT && tar czf ab.tgz ab && rm -rf ab
