#!/bin/bash
# Session 13, call 11: 64-row swap-AB tiles for 64 / 128 tokens (swapab_m64n64_ws2_st12,
# swapab_m128n64_ws2_st7) against the 1d2d m64 tiles and the 128-row swap-AB at M = 64 / 128,
# harness, 2 rounds in opposite order; --quick correctness.
cd "$(dirname "$0")/../.."
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
tar xJf build-pack/exp/b.txz -C .device
H=.device/b/sm90_fp8_gemm_harness
timeout 200 $H --quick > $OUT/quick.log 2>&1; tail -1 $OUT/quick.log; grep FAIL $OUT/quick.log | head
C64="m64n64_ws1_st12,m64n96_ws1_st10,m64n128_ws1_st8,swapab_m32n128_ws2_st10,swapab_m64n128_ws2_st8,swapab_m64n64_ws2_st12"
C128="m64n64_ws1_st12,m64n96_ws1_st10,m64n128_ws1_st8,swapab_m64n128_ws2_st8,swapab_m64n64_ws2_st12,swapab_m128n64_ws2_st7,m128n128_ws2_st5"
C16="swapab_m16n128_ws2_st11,swapab_m16n64_ws2_st15,m64n96_ws1_st10"
rev() { echo "$1" | tr ',' '\n' | tac | paste -sd,; }
for r in 0 1; do
  for nk in 4096,2048 6144,4096 6144,16384 7168,16384 16384,2048 24576,1536; do
    for mc in "16 $C16" "64 $C64" "128 $C128"; do
      set -- $mc; c=$2; (( r )) && c=$(rev $c)
      timeout 90 $H --reps 31 --mnk $1,$nk --config $c | grep "^M=" | sed "s/^/r$r /"
    done
  done
done > $OUT/ab.log 2>&1
python3 - $OUT/ab.log <<'PY'
import sys,re,collections,statistics
d=collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(sys.argv[1]):
    m=re.match(r"r\d M=(\d+)\s+N=(\d+)\s+K=(\d+)\s+(\S+).*?([\d.]+) us",l)
    if m: d[(int(m[2]),int(m[3]),int(m[1]))][m[4]].append(float(m[5]))
for k in sorted(d):
    v=sorted((statistics.median(x),c) for c,x in d[k].items())
    print(f"{k[0]}x{k[1]} M={k[2]:<4}", "  ".join(f"{c.replace('_ws','/')} {t:.2f}" for t,c in v))
PY
