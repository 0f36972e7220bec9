#!/bin/bash
# Session 13, call 5: the swap-AB consumer's steps per K block (passed, MMAs issued, done, promoted), M = 16.
cd "$(dirname "$0")/../.."
tar xJf build-pack/exp/ht.txz -C build-pack/exp && tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
for p in "16,4096,2048 swapab_m16n128_ws2_st11" "16,16384,2048 swapab_m16n128_ws2_st11"; do set -- $p
timeout 90 build-pack/exp/harness_trace --trace --reps 25 --mnk $1 --config $2 | grep TRACE | grep -v probe | sed 's/TRACE M=.*ws2_st11 *\*//' | tr -s ' '
done
