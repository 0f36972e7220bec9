#!/bin/bash
# Session 13, call 3: globaltimer trace of the swap-AB kernel at small M next to the bare TMA
# stream of the same weight (harness built with -DFP8PROJ_TRACE).
cd "$(dirname "$0")/../.."
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
H=build-pack/exp/harness_trace
run() { timeout 90 $H --trace --reps 25 --mnk $1 --config $2; }
{
run 16,4096,2048 swapab_m16n128_ws2_st11
run 16,16384,2048 swapab_m16n128_ws2_st11
run 16,6144,4096 swapab_m16n128_ws2_st11
} > $OUT/trace.log 2>&1
grep -E "TRACE|^M=|fail" $OUT/trace.log | grep -v "slot [1-3][0-9]" 
grep -E "slot (1[6-9]|2[0-9]|3[0-9]|4[0-7])" $OUT/trace.log | head -80
