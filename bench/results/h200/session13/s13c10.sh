#!/bin/bash
# Session 13, call 10: swap-AB kernels with an L2 prefetch of the first stages' weight lines at
# kernel entry (P) against the same kernels without (B), harness, 3 rounds alternating.
cd "$(dirname "$0")/../.."
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
tar xJf build-pack/exp/b.txz -C .device
B=.device/b/sm90_fp8_gemm_harness; P=.device/b/harness_p
timeout 200 $P --quick > $OUT/quick_p.log 2>&1; tail -1 $OUT/quick_p.log
for r in 0 1 2; do
  for nk in 4096,2048 6144,4096 6144,16384 7168,16384 16384,2048 24576,1536; do
    for mc in "16 swapab_m16n128_ws2_st11,swapab_m16n64_ws2_st15" "1 swapab_m16n64_ws2_st15" "32 swapab_m32n128_ws2_st10"; do
      set -- $mc
      for w in B P; do
        if (( r % 2 )); then X=$([[ $w == B ]] && echo P || echo B); else X=$w; fi
        bin=${!X}; timeout 60 $bin --reps 31 --mnk $1,$nk --config $2 | grep "^M=" | sed "s/^/$X r$r /"
      done
    done
  done
done > $OUT/abp.log 2>&1
python3 - $OUT/abp.log <<'PY'
import sys,re,collections,statistics
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    m=re.match(r"(\w) r\d M=(\d+)\s+N=(\d+)\s+K=(\d+)\s+(\S+).*?([\d.]+) us",l)
    if m: d[(int(m[3]),int(m[4]),int(m[2]),m[5],m[1])].append(float(m[6]))
ks=sorted({k[:4] for k in d}); g=[]
for k in ks:
    b=statistics.median(d[k+('B',)]); p=statistics.median(d[k+('P',)]); g.append(p/b)
    print(f"{k[0]}x{k[1]} M={k[2]:<3} {k[3]:26s} no-prefetch {b:7.2f}  prefetch {p:7.2f}  P/B {p/b:.3f}")
import math; print("geomean P/B", round(math.exp(sum(map(math.log,g))/len(g)),4))
PY
