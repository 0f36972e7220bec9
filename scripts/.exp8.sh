set -u
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
.device/bin/fp8proj info 2>&1 | head -3 > $OUT/info.txt
start=$SECONDS
timeout 500 .device/bin/sm90_fp8_gemm_harness --shapes correctness --no-timing > $OUT/harness_correctness.log 2>&1
echo "rc=$? $((SECONDS-start)) s" | tee -a $OUT/harness_correctness.log
tail -2 $OUT/harness_correctness.log
gzip $OUT/harness_correctness.log
