#!/bin/bash
# Session 14, call 2: as call 1 with the first scale loads issued before the consumers wait; the pipeline hand-over without __syncthreads (producer bar.arrive, consumers
# bar.sync; "early"): correctness (harness --quick) of the new build, then the DeepGEMM comparison
# at M <= 1024 (36 points), A = main (42fc36f's SASS = bundle_new), B = early, interleaved, 2 runs.
cd "$(dirname "$0")/../../../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
tar xJf build-pack/exp/early2.txz -C .device
timeout 200 .device/early/bin/sm90_fp8_gemm_harness --quick > $OUT/quick_early.log 2>&1; echo "quick rc $?"; tail -2 $OUT/quick_early.log
FP8PROJ_C_LIB_B=$PWD/.device/early/lib/libfp8proj_c.so RUNS=2 COMPARE_ARGS="--reps 45 --m 16,64,128,256,512,1024" timeout 380 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "dg rc $?"
grep -E "^Same run|^Against|^Build B|^NVIDIA|B/A" $OUT/dg.log | head -20
