#!/bin/bash
# Session 15, call 4: main vs P (branch exp/b-hint: the 1d2d kernels load the weight at normal L2
# priority when it fits in the L2 (N x K <= 48 MiB) and more than 4 M blocks read each tile;
# evict-first otherwise, as main always does). Same table (configs/nvidia-h200.json) for both.
cd "$(dirname "$0")/../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/s15/libP.so.xz > .device/libP.so; chmod +x .device/libP.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
FP8PROJ_C_LIB=$PWD/.device/lib/libfp8proj_c.so FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json \
  FP8PROJ_C_LIB_B=$PWD/.device/libP.so AB_BOTH_WAYS=1 RUNS=2 \
  COMPARE_ARGS="--reps 45 --m 512,1024,2048,4096,8192,32768" timeout 400 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1
echo "rc $?"; cat $OUT/ab_both_ways.md
