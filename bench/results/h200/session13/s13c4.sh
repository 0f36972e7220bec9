#!/bin/bash
# Session 13, call 4: swap-AB with independent partials per k32 step (B) against main (A):
# harness A/B at small M (3 rotated rounds), the trace of B, and B's --quick correctness run.
cd "$(dirname "$0")/../.."
tar xJf build-pack/exp/hb.txz -C build-pack/exp && tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
A=.device/bin/sm90_fp8_gemm_harness; B=build-pack/exp/harness_b
P=("16,4096,2048 swapab_m16n128_ws2_st11" "16,16384,2048 swapab_m16n128_ws2_st11" "16,6144,4096 swapab_m16n128_ws2_st11"
   "16,6144,16384 swapab_m16n128_ws2_st11" "16,7168,16384 swapab_m16n128_ws2_st11" "64,6144,4096 swapab_m32n128_ws2_st10"
   "64,7168,16384 swapab_m32n128_ws2_st10" "64,4096,2048 swapab_m64n128_ws2_st8" "1,4096,2048 swapab_m16n128_ws2_st11")
for r in 1 2 3; do
  for p in "${P[@]}"; do set -- $p
    for w in A B; do
      if [[ $(( r % 2 )) == 1 ]]; then X=$w; else X=$([[ $w == A ]] && echo B || echo A); fi
      bin=${!X}; echo -n "$X r$r "; timeout 60 $bin --reps 41 --mnk $1 --config $2 | grep "^M="
    done
  done
done > $OUT/ab.log 2>&1
python3 - $OUT/ab.log <<'PY'
import sys,re,collections,statistics
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    m=re.match(r"(\w) r\d M=(\d+)\s+N=(\d+)\s+K=(\d+)\s+(\S+).*?([\d.]+) us",l)
    if m: d[(m[3],m[4],m[2],m[5])+(m[1],)].append(float(m[6]))
keys=sorted({k[:4] for k in d})
for k in keys:
    a=statistics.median(d[k+('A',)]); b=statistics.median(d[k+('B',)])
    print(f"{k[0]}x{k[1]} M={k[2]:>4} {k[3]:26s} A {a:8.2f} B {b:8.2f} B/A {b/a:.3f}")
PY
timeout 90 build-pack/exp/harness_trace --trace --reps 25 --mnk 16,4096,2048 --config swapab_m16n128_ws2_st11 > $OUT/trace_b.log 2>&1
grep -E "TRACE" $OUT/trace_b.log | grep -E "events|slot ( [0-9]|1[0-9]|2[0-9]|3[0-9]|4[0-9]):" | awk '{print $NF, $0}' | cut -c1-160 | head -60 > /dev/null
timeout 200 $B --quick > $OUT/quick_b.log 2>&1; tail -1 $OUT/quick_b.log
