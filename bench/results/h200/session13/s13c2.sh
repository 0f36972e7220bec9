#!/bin/bash
# Session 13, call 2: the timing regime (flush kind/size, host-ahead sleep, sync per call) at small M.
cd "$(dirname "$0")/../.."
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
export FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
timeout 400 python3 build-pack/exp/regime.py $PWD/.device/lib/libfp8proj_c.so 41 > $OUT/regime.log 2>&1
cat $OUT/regime.log
for a in "16,4096,2048 swapab_m16n128_ws2_st11" "64,4096,2048 m64n64_ws1_st12" "16,16384,2048 swapab_m16n128_ws2_st11"; do
  set -- $a; timeout 60 build-pack/exp/harness_warm --reps 41 --mnk $1 --config $2 | grep "^M="
done 2>&1 | tee $OUT/harness.log
