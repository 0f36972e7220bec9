#!/bin/bash
# Session 14, call 4: (1) the early hand-over in the 1d2d kernel only (swap-AB back to
# __syncthreads; early4_1d2d_only.patch): harness --quick, then the DeepGEMM comparison at M <= 256,
# A = main (bundle_new), B = early4, 3 runs. (2) A table experiment at 4096x2048, M = 64:
# m64n32_ws1_st15 (DeepGEMM's 64x32 tile shape) instead of m64n64_ws1_st12, B = main's library
# with FP8PROJ_TUNE_FILE_EXP (session13/tune_file_exp.patch), 3 runs.
cd "$(dirname "$0")/../../../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
tar xJf build-pack/exp/early4.txz -C .device
xz -dc build-pack/exp/libfp8proj_c_exp.so.xz > .device/libfp8proj_c_exp.so && chmod +x .device/libfp8proj_c_exp.so
timeout 200 .device/early/bin/sm90_fp8_gemm_harness --quick > $OUT/quick_early.log 2>&1; echo "quick rc $?"; tail -1 $OUT/quick_early.log
FP8PROJ_C_LIB_B=$PWD/.device/early/lib/libfp8proj_c.so RUNS=3 COMPARE_ARGS="--reps 45 --m 16,64,128,256" timeout 300 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "dg rc $?"
grep -E "^Build B" $OUT/dg.log
mkdir -p $OUT/t && OUT=$OUT/t FP8PROJ_TUNE_FILE_EXP=$PWD/build-pack/exp/table_m64n32.json FP8PROJ_C_LIB_B=$PWD/.device/libfp8proj_c_exp.so RUNS=3 \
  COMPARE_ARGS="--reps 45 --only 4096,2048 --m 64" timeout 200 bash scripts/h200_deepgemm.sh > $OUT/t/dg_table.log 2>&1; echo "dg table rc $?"
grep -E "M=    64|^Build B" $OUT/t/dg_table.log
cp $OUT/t/deepgemm_compare.tgz $OUT/table_compare.tgz; rm -rf $OUT/t/run* $OUT/t/prewarm
