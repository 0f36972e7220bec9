#!/bin/bash
# Session 13, call 7: swap-AB with a 64-row weight tile, K split between the warpgroups
# (swapab_m16n64_ws2_st15 / m32n64) against the 128-row tile and m64n64 at M = 16 / 32 / 64:
# harness, 3 rounds in rotated order; trace of the new kernel; --quick correctness.
cd "$(dirname "$0")/../.."
tar xJf build-pack/exp/hb.txz -C build-pack/exp && tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
H=build-pack/exp/harness_b
timeout 200 $H --quick > $OUT/quick_b.log 2>&1; tail -1 $OUT/quick_b.log; grep -i "fail" $OUT/quick_b.log | head -5
C16=(swapab_m16n128_ws2_st11 swapab_m16n64_ws2_st15 m64n64_ws1_st12 swapab_m32n64_ws2_st15)
C64=(swapab_m32n128_ws2_st10 swapab_m32n64_ws2_st15 m64n64_ws1_st12 m64n96_ws1_st10)
for r in 0 1 2; do
  for nk in 4096,2048 6144,4096 6144,16384 7168,16384 16384,2048 6144,1536 7168,2048 24576,1536; do
    for m in 16 64; do
      if [[ $m == 16 ]]; then c=("${C16[@]}"); else c=("${C64[@]}"); fi
      rot=("${c[@]:r}" "${c[@]:0:r}")
      list=$(IFS=,; echo "${rot[*]}")
      timeout 60 $H --reps 31 --mnk $m,$nk --config $list | grep "^M=" | sed "s/^/r$r /"
    done
  done
done > $OUT/ab64.log 2>&1
python3 - $OUT/ab64.log <<'PY'
import sys,re,collections,statistics
d=collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(sys.argv[1]):
    m=re.match(r"r\d M=(\d+)\s+N=(\d+)\s+K=(\d+)\s+(\S+).*?([\d.]+) us",l)
    if m: d[(int(m[2]),int(m[3]),int(m[1]))][m[4]].append(float(m[5]))
for k in sorted(d):
    print(f"{k[0]}x{k[1]} M={k[2]:<3}", "  ".join(f"{c} {statistics.median(v):6.2f}" for c,v in d[k].items()))
PY
timeout 60 build-pack/exp/harness_trace --trace --reps 25 --mnk 16,4096,2048 --config swapab_m16n64_ws2_st15 > $OUT/trace64.log 2>&1
grep TRACE $OUT/trace64.log | grep -v probe | sed 's/TRACE M=.*st15 *\*//' | tr -s ' ' | grep -E "events|slot (10|1[6-9]|2[0-9]|3[01]|4[89]|5[0-9]|6[0-3]):"
