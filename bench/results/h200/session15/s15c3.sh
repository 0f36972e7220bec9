#!/bin/bash
# Session 15, call 3: the cluster kernels' B-operand L2 hint. B = leader-only multicast (call 1)
# with main's evict-first policy on B; H1 = no hint on B in cluster kernels; H2 = CUTLASS's
# EVICT_NORMAL hint constant (what DeepGEMM passes). Non-cluster kernels identical throughout.
cd "$(dirname "$0")/../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
for f in libB.so libH1.so libH2.so; do xz -dc build-pack/s15/$f.xz > .device/$f; chmod +x .device/$f; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
run() {  # name libX tableX libY tableY
  mkdir -p $OUT/$1
  OUT=$OUT/$1 FP8PROJ_C_LIB=$2 FP8PROJ_TUNE_FILE=$3 FP8PROJ_C_LIB_B=$4 FP8PROJ_TUNE_FILE_EXP=$5 AB_BOTH_WAYS=1 RUNS=2 \
    COMPARE_ARGS="--reps 45 --m 2048,8192" timeout 170 bash scripts/h200_deepgemm.sh > $OUT/$1/dg.log 2>&1
  echo "$1 rc $?"; tail -1 $OUT/$1/ab_both_ways.md
}
T=$PWD/build-pack/s15 M=$PWD/.device/lib/libfp8proj_c.so C=$PWD/configs/nvidia-h200.json
run B_vs_H1_256mcn2 $PWD/.device/libB.so $T/t_256mcn2.json $PWD/.device/libH1.so $T/t_256mcn2.json
run B_vs_H2_256mcn2 $PWD/.device/libB.so $T/t_256mcn2.json $PWD/.device/libH2.so $T/t_256mcn2.json
run main_vs_H1_192mc2 $M $C $PWD/.device/libH1.so $T/t_192mc2.json
run main_vs_H2_192mc2 $M $C $PWD/.device/libH2.so $T/t_192mc2.json
cd $OUT && find . -name "*.so" -delete; tar czf s15c3.tgz */deepgemm_compare.tgz */ab_both_ways.* */dg.log gpu.txt && ls
