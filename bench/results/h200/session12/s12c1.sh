#!/bin/bash
# session 12, call 1: (a) exp/carry-after-fence-early-release (h_ef) and (b) exp/fixedk-clusters (h_fk):
# --quick of both, then a rotated 3-round A/B against main (h_main) over the large-M tiles.
tar xJf build-pack/exp/h1.txz -C /tmp
mkdir -p /tmp/r/ab /tmp/r/ab2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv > /tmp/r/gpu.txt
for b in h_ef h_fk; do
  t0=$SECONDS; timeout 200 /tmp/h1/$b --quick > /tmp/r/quick_$b.log 2>&1
  echo "quick $b rc=$? $((SECONDS - t0)) s $(tail -n 1 /tmp/r/quick_$b.log)"
done
C=m128n192_ws2_st4,m128n192_ws2_st4_c,m256n128_ws2_st3,m256n128_ws2_st3_c,m128n128_ws2_st5,m128n128_ws2_st5_c,m128n192_ws2_st4_mc2,m256n128_ws2_st3_mc2,m128n192_ws2_st4_mcn2
B=(h_main h_ef h_fk)
for r in 1 2 3; do
  for i in 0 1 2; do
    b=${B[$(( (i + r - 1) % 3 ))]}
    t0=$SECONDS
    timeout 60 /tmp/h1/$b --shapes design --reps 15 --config $C > /tmp/r/ab/$b.r$r.log 2>&1
    echo "round $r $b rc=$? $((SECONDS - t0)) s $(tail -n 1 /tmp/r/ab/$b.r$r.log)"
  done
done
# h_fk alone: DeepGEMM's 256x128 A-multicast tile (compiled per K) against the others
for r in 1 2; do
  timeout 60 /tmp/h1/h_fk --shapes design --reps 15 --config m256n128_ws2_st3_mcn2,m256n128_ws2_st3,m128n192_ws2_st4,m256n128_ws2_st3_mc2,m128n192_ws2_st4_mc2 > /tmp/r/ab2/h_fk.r$r.log 2>&1
  echo "mcn2 round $r rc=$? $(tail -n 1 /tmp/r/ab2/h_fk.r$r.log)"
done
python3 scripts/ab_compare.py /tmp/r/ab --base h_main > /tmp/r/ab_compare.txt 2>&1
tail -n 3 /tmp/r/ab_compare.txt
tar czf $OUT/r.tgz -C /tmp r
