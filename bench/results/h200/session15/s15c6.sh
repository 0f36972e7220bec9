#!/bin/bash
# Session 15, call 6: the DeepGEMM comparison over DESIGN.md's 66 points, two runs, with the
# library of branch exp/b-hint (bundle_s15: weight L2 policy by weight_evict_first) and
# configs/nvidia-h200.json.
cd "$(dirname "$0")/../.."
tar xJf build-pack/s15/bundle_s15.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
RUNS=2 COMPARE_ARGS="--reps 45" timeout 420 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "rc $?"
grep -h "Same run\|Against DESIGN\|peak\|Peak" $OUT/run*/compare_deepgemm.md
