#!/bin/bash
# Session 13, call 12: DeepGEMM comparison over DESIGN.md's 66 points, A = main before this
# session (libraries of 5df2d27, table of session 10), B = 5cd947a (swapab_m16n64_ws2_st15,
# M <= 16 re-tuned table) through FP8PROJ_TUNE_FILE_EXP (an experiment-only one-line patch,
# tune_file_exp.patch, not on main); 2 runs.
cd "$(dirname "$0")/../.."
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/exp/libfp8proj_c_exp.so.xz > .device/libfp8proj_c_b.so && chmod +x .device/libfp8proj_c_b.so
git show HEAD~1:configs/nvidia-h200.json > .device/table_a.json 2>/dev/null || cp build-pack/exp/table_a.json .device/table_a.json
FP8PROJ_TUNE_FILE=$PWD/.device/table_a.json FP8PROJ_TUNE_FILE_EXP=$PWD/configs/nvidia-h200.json \
  FP8PROJ_C_LIB_B=$PWD/.device/libfp8proj_c_b.so RUNS=2 COMPARE_ARGS="--reps 45" timeout 540 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "dg rc $?"
grep -E "^Same run|^Against|^Build B|^NVIDIA" $OUT/dg.log
