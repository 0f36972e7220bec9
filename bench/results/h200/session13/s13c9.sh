#!/bin/bash
# Session 13, call 9: re-tune the M <= 16 buckets with the 64-row swap-AB tile in the family,
# then DeepGEMM comparison at M = 16: A = main (libraries of 5df2d27, configs/nvidia-h200.json),
# B = this branch with the merged table; 3 runs.
cd "$(dirname "$0")/../.."
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
mkdir -p .device/b && tar xJf build-pack/exp/b.txz -C .device
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
timeout 200 .device/b/fp8proj tune --max-m 16 --budget 90 --out $OUT/tune16.json > $OUT/tune16.log 2>&1; echo "tune rc $?"
tail -3 $OUT/tune16.log
python3 build-pack/exp/merge16.py configs/nvidia-h200.json $OUT/tune16.json $OUT/table_b.json > $OUT/merge.log 2>&1; cat $OUT/merge.log
FP8PROJ_TUNE_FILE_EXP=$OUT/table_b.json FP8PROJ_C_LIB_B=$PWD/.device/b/libfp8proj_c.so RUNS=3 \
  COMPARE_ARGS="--m 16 --reps 45" timeout 480 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "dg rc $?"
grep -E "M=    16|geometric|summary|B " $OUT/dg.log | tail -40
