#!/bin/bash
# session 12, call 2: DeepGEMM comparison, main (A) interleaved with exp/fixedk-clusters (B) whose
# table names m256n128_ws2_st3_mcn2 (DeepGEMM's tile, compiled per K) at every M >= 1024 bucket.
tar xJf build-pack/bundle.txz && tar xJf build-pack/exp/libb_fk.txz -C /tmp
export LD_LIBRARY_PATH=$PWD/.device/lib
export FP8PROJ_TUNE_FILE_EXP=$PWD/build-pack/exp/table_mcn2.json
FP8PROJ_C_LIB_B=/tmp/libb/libfp8proj_c.so RUNS=2 timeout 420 bash scripts/h200_deepgemm.sh 2>&1 | tail -n 30
