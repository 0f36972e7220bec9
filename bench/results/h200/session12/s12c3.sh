#!/bin/bash
# session 12, call 3: exp/direct-store (epilogue from registers, +1-stage variants):
# --quick, harness A/B vs main, then the DeepGEMM comparison with B = the direct-store library,
# once with main's table (same names: the epilogue alone), once with +1 stage (table_st.json).
tar xJf build-pack/bundle.txz && tar xJf build-pack/exp/h1.txz -C /tmp && tar xJf build-pack/exp/h3.txz -C /tmp
export LD_LIBRARY_PATH=$PWD/.device/lib
mkdir -p /tmp/r/ab
t0=$SECONDS; timeout 200 /tmp/h3/h_ds --quick > /tmp/r/quick_ds.log 2>&1; echo "quick ds rc=$? $((SECONDS - t0)) s $(tail -n 1 /tmp/r/quick_ds.log)"
C=m128n192_ws2_st4,m128n192_ws2_st4_c,m256n128_ws2_st3,m256n128_ws2_st3_c,m128n128_ws2_st5,m128n128_ws2_st5_c,m64n128_ws1_st8
CX=$C,m128n192_ws2_st5,m128n192_ws2_st5_c,m256n128_ws2_st4,m128n128_ws2_st6,m128n128_ws2_st6_c
for r in 1 2; do
  timeout 60 /tmp/h1/h_main --shapes design --reps 15 --config $C > /tmp/r/ab/h_main.r$r.log 2>&1; echo "r$r main rc=$? $(tail -n 1 /tmp/r/ab/h_main.r$r.log)"
  timeout 90 /tmp/h3/h_ds --shapes design --reps 15 --config $CX > /tmp/r/ab/h_ds.r$r.log 2>&1; echo "r$r ds rc=$? $(tail -n 1 /tmp/r/ab/h_ds.r$r.log)"
done
tar czf $OUT/r.tgz -C /tmp r
grep -q "0 failed" /tmp/r/quick_ds.log || { echo "quick failed: no comparison"; exit 1; }
OUT=$OUT/c1 FP8PROJ_C_LIB_B=/tmp/h3/libds/libfp8proj_c.so RUNS=1 timeout 240 bash scripts/h200_deepgemm.sh 2>&1 | tail -n 4
FP8PROJ_TUNE_FILE_EXP=$PWD/build-pack/exp/table_st.json OUT=$OUT/c2 FP8PROJ_C_LIB_B=/tmp/h3/libds/libfp8proj_c.so RUNS=1 timeout 200 bash scripts/h200_deepgemm.sh 2>&1 | tail -n 4
cd $OUT && tar czf all.tgz r.tgz c1/deepgemm_compare.tgz c2/deepgemm_compare.tgz 2>/dev/null; rm -rf c1 c2 r.tgz; ls $OUT
