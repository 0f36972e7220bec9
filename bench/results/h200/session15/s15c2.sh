#!/bin/bash
# Session 15, call 2: (a) how many 2-CTA clusters at 227 KB run at once (occupancy query vs a
# timed launch); (b) C = B + a full grid of clusters (no occupancy cap, as DeepGEMM launches):
# main (plain tiles, its table) vs C with cluster tiles at M 1025-2048 / 4097-8192, and B vs C.
cd "$(dirname "$0")/../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
for f in libB.so libC.so; do xz -dc build-pack/s15/$f.xz > .device/$f; chmod +x .device/$f; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
timeout 60 build-pack/s15/occ/occ > $OUT/occ.log 2>&1; echo "occ rc $?"; cat $OUT/occ.log
run() {  # name libX tableX libY tableY
  mkdir -p $OUT/$1
  OUT=$OUT/$1 FP8PROJ_C_LIB=$2 FP8PROJ_TUNE_FILE=$3 FP8PROJ_C_LIB_B=$4 FP8PROJ_TUNE_FILE_EXP=$5 AB_BOTH_WAYS=1 RUNS=2 \
    COMPARE_ARGS="--reps 45 --m 2048,8192" timeout 170 bash scripts/h200_deepgemm.sh > $OUT/$1/dg.log 2>&1
  echo "$1 rc $?"; tail -3 $OUT/$1/ab_both_ways.md
}
T=$PWD/build-pack/s15
run main_vs_C192mc2 $PWD/.device/lib/libfp8proj_c.so $PWD/configs/nvidia-h200.json $PWD/.device/libC.so $T/t_192mc2.json
run main_vs_C256mcn2 $PWD/.device/lib/libfp8proj_c.so $PWD/configs/nvidia-h200.json $PWD/.device/libC.so $T/t_256mcn2.json
run B_vs_C192mcn2 $PWD/.device/libB.so $T/t_192mcn2.json $PWD/.device/libC.so $T/t_192mcn2.json
cd $OUT && tar czf s15c2.tgz */deepgemm_compare.tgz */ab_both_ways.* */dg.log occ.log gpu.txt && ls
