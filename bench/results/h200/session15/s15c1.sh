#!/bin/bash
# Session 15, call 1: leader-only multicast (B) vs the half-tile multicast of main's cluster
# kernels (A), both with session 12's FixedK clusters + m256n128_ws2_st3_mcn2; same table for
# both (each run's libs read FP8PROJ_TUNE_FILE_EXP), DeepGEMM and bf16 in the same process.
cd "$(dirname "$0")/../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
for f in libA.so libB.so harnessA harnessB; do xz -dc build-pack/s15/$f.xz > .device/$f; chmod +x .device/$f; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
CL=m128n128_ws2_st5_mc2,m256n128_ws2_st3_mc2,m128n192_ws2_st4_mc2,m128n160_ws2_st5_mc2,m128n96_ws2_st7_mcn2,m128n112_ws2_st6_mcn2,m128n128_ws2_st5_mcn2,m128n192_ws2_st4_mcn2,m256n128_ws2_st3_mcn2
timeout 120 .device/harnessB --quick --config $CL > $OUT/quickB.log 2>&1; echo "quickB rc $?"; tail -3 $OUT/quickB.log
for t in t_256mcn2 t_192mcn2 t_192mc2; do
  mkdir -p $OUT/$t
  OUT=$OUT/$t FP8PROJ_TUNE_FILE=$PWD/build-pack/s15/$t.json FP8PROJ_TUNE_FILE_EXP=$PWD/build-pack/s15/$t.json \
    FP8PROJ_C_LIB=$PWD/.device/libA.so FP8PROJ_C_LIB_B=$PWD/.device/libB.so AB_BOTH_WAYS=1 RUNS=2 \
    COMPARE_ARGS="--reps 45 --m 2048,8192" timeout 200 bash scripts/h200_deepgemm.sh > $OUT/$t/dg.log 2>&1
  echo "$t rc $?"; cat $OUT/$t/ab_both_ways.md | tail -20
done
cd $OUT && tar czf s15c1.tgz */deepgemm_compare.tgz */ab_both_ways.* */dg.log quickB.log gpu.txt && ls
