#!/bin/bash
# Session 14, call 7: main as it lands (kernels = 42fc36f's SASS, byte-identical; table with
# m64n32_ws1_st15 at 4096x2048 M 33-64 and swapab_m32n128_ws2_st10 at 7168x16384 M <= 16):
# the DeepGEMM comparison over DESIGN.md's 66 points (2 runs), the tuned table's gate check at
# the changed buckets' M, `fp8proj bench` and `fp8proj layer` (binaries built from this tree).
cd "$(dirname "$0")/../../../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
tar xJf build-pack/exp/final.txz -C .device
F=.device/final/bin/fp8proj
export FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json
RUNS=2 FP8PROJ_C_LIB=$PWD/.device/final/lib/libfp8proj_c.so COMPARE_ARGS="--reps 45" timeout 330 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1; echo "dg rc $?"
grep -E "^Same run|^Against" $OUT/dg.log
timeout 90 $F tune --check configs/nvidia-h200.json --check-m 16,48,64 --csv $OUT/gatecheck.csv > $OUT/gatecheck.log 2>&1; echo "gatecheck rc=$? $(tail -n 2 $OUT/gatecheck.log | tr '\n' ' ')"
timeout 120 $F bench --csv $OUT/bench.csv --json $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc $?"
timeout 90 $F layer --model glm5 --tp 1,4 --seqs 4,8,16,32,64 --seqlen 1024 --csv $OUT/layer.csv --json $OUT/layer.json --md $OUT/layer.md > $OUT/layer.log 2>&1; echo "layer rc $?"
cd $OUT && tar czf extra.tgz gatecheck.* bench.* layer.* && rm -f gatecheck.csv bench.csv bench.json layer.csv layer.json layer.md
