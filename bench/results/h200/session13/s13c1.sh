#!/bin/bash
# Session 13, call 1: does the timed call pay for fetching its own code after the flush?
cd "$(dirname "$0")/../.."
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
H=build-pack/exp/harness_warm
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt 2>&1
run() { timeout 90 $H --warm-probe --reps ${3:-40} --mnk $1 --config $2; }
{
run 16,4096,2048 swapab_m16n128_ws2_st11
run 64,4096,2048 m64n64_ws1_st12
run 128,4096,2048 m64n64_ws1_st12
run 16,4096,2048 m64n32_ws1_st15
run 16,16384,2048 swapab_m16n128_ws2_st11
run 16,6144,4096 swapab_m16n128_ws2_st11
run 16,7168,16384 swapab_m16n128_ws2_st11
run 128,24576,1536 m64n128_ws1_st8
run 512,4096,2048 m128n128_ws2_st5
run 4096,4096,2048 m256n128_ws2_st3 20
} > $OUT/warm.log 2>&1
grep -E "^WARM|^M=|fail" $OUT/warm.log
