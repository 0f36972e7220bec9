#!/bin/bash
# session 12, call 6: exp/stagger (every other CTA starts a fraction of a tile late):
# harness with FP8PROJ_EXP_STAGGER unset / 0.25 / 0.5 (3 rotated rounds), then the DeepGEMM
# comparison, B = the stagger library at 0.5, then at 0.25.
tar xJf build-pack/bundle.txz && tar xJf build-pack/exp/h6.txz -C /tmp
export LD_LIBRARY_PATH=$PWD/.device/lib
mkdir -p /tmp/r/ab
FP8PROJ_EXP_STAGGER=0.5 timeout 100 /tmp/h6/h_st --quick > /tmp/r/quick_st.log 2>&1; echo "quick rc=$? $(tail -n 1 /tmp/r/quick_st.log)"
C=m128n192_ws2_st4,m256n128_ws2_st3,m128n128_ws2_st5,m128n192_ws2_st4_c
V=(0 0.25 0.5)
for r in 1 2 3; do
  for i in 0 1 2; do
    v=${V[$(( (i + r - 1) % 3 ))]}
    if [ "$v" = 0 ]; then unset FP8PROJ_EXP_STAGGER; else export FP8PROJ_EXP_STAGGER=$v; fi
    timeout 60 /tmp/h6/h_st --shapes design --reps 15 --config $C > /tmp/r/ab/st$v.r$r.log 2>&1
    echo "r$r st$v rc=$? $(tail -n 1 /tmp/r/ab/st$v.r$r.log)"
  done
done
unset FP8PROJ_EXP_STAGGER
tar czf $OUT/r.tgz -C /tmp r
FP8PROJ_EXP_STAGGER=0.5 OUT=$OUT/c1 FP8PROJ_C_LIB_B=/tmp/h6/libst/libfp8proj_c.so RUNS=1 timeout 240 bash scripts/h200_deepgemm.sh 2>&1 | tail -n 2
FP8PROJ_EXP_STAGGER=0.25 OUT=$OUT/c2 FP8PROJ_C_LIB_B=/tmp/h6/libst/libfp8proj_c.so RUNS=1 timeout 150 bash scripts/h200_deepgemm.sh 2>&1 | tail -n 2
cd $OUT && tar czf all.tgz r.tgz c1/deepgemm_compare.tgz c2/deepgemm_compare.tgz 2>/dev/null; rm -rf c1 c2 r.tgz; ls $OUT
