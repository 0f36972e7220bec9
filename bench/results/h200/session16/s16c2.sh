#!/bin/bash
# (The tables live in build-pack/s16/, outside the repository; their differences: tables_tried.md.)
# Session 16, call 2: a table A/B in the DeepGEMM comparison, same library for both (session 15's
# main, libMain.so): A = configs/nvidia-h200.json, B = tableB.json (19 buckets changed: 256x128
# carried at large M, 4096x2048 M = 64 swap-AB 64-token tiles, M = 512 128x128 with A shared along
# N). Both ways round; the 23 unchanged points are controls.
cd "$(dirname "$0")/../.."
tar xJf build-pack/s16/bundle_s16.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/s16/libMain.so.xz > .device/libMain.so; chmod +x .device/libMain.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
mkdir -p $OUT/ab
OUT=$OUT/ab FP8PROJ_C_LIB=$PWD/.device/libMain.so FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json \
  FP8PROJ_C_LIB_B=$PWD/.device/libMain.so FP8PROJ_TUNE_FILE_B=$PWD/build-pack/s16/tableB.json AB_BOTH_WAYS=1 RUNS=2 \
  COMPARE_ARGS="--reps 45 --m 64,512,2048,4096,8192,16384,32768" timeout 520 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1
echo "rc $?"; cat $OUT/ab/ab_both_ways.md
cd $OUT && tar czf ab.tgz ab && rm -rf ab
