#!/bin/bash
# Session 16, call 1: the narrow last N block (kNarrowEdge: m64n64 WGMMAs where at most 64 of a
# wide tile's columns lie inside N). Binaries built from the working tree on the build machine:
# GPU tests (with Sm90NarrowEdgeGpu), CPU tests, harness --quick, the correctness sweep, verify;
# then main (A: session 15's library) vs the change (B), both ways round in the DeepGEMM
# comparison, same table, M = 2048, 8192, 16384, 32768 on DESIGN.md's six shapes.
cd "$(dirname "$0")/../.."
tar xJf build-pack/s16/bundle_s16.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/s16/libMain.so.xz > .device/libMain.so; chmod +x .device/libMain.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
H200_BUDGET_S=150 bash scripts/h200.sh info tests harness correctness verify 2>&1 | grep "^\[h200"
mkdir -p $OUT/ab
OUT=$OUT/ab FP8PROJ_C_LIB=$PWD/.device/libMain.so FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json \
  FP8PROJ_C_LIB_B=$PWD/.device/lib/libfp8proj_c.so AB_BOTH_WAYS=1 RUNS=2 \
  COMPARE_ARGS="--reps 45 --m 2048,8192,16384,32768" timeout 400 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1
echo "rc $?"; cat $OUT/ab/ab_both_ways.md
cd $OUT && tar czf ab.tgz ab && rm -rf ab
