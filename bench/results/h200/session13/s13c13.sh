#!/bin/bash
# Session 13, call 13: 5cd947a binaries on the H200: GPU tests, C API tests, harness --quick and
# the issue's correctness sweep, verify, the tuned table's gate check, bench, sanitizers
# (h200.sh), plus memcheck and racecheck of swapab_m16n64_ws2_st15 itself.
cd "$(dirname "$0")/../.."
tar xJf build-pack/exp/bundle_new.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
H=.device/bin/sm90_fp8_gemm_harness
timeout 60 .device/bin/fp8proj_c_api_tests --gtest_brief=1 > $OUT/c_api.log 2>&1; echo "c_api rc=$? $(tail -n 2 $OUT/c_api.log | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $H --no-timing --config swapab_m16n64_ws2_st15 \
  --mnk 1,256,128 --mnk 5,640,384 --mnk 16,4096,2048 --mnk 13,7168,16384 > $OUT/memcheck_m16n64.log 2>&1; echo "memcheck m16n64 rc=$? $(tail -n 2 $OUT/memcheck_m16n64.log | tr '\n' ' ')"
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $H --no-timing --config swapab_m16n64_ws2_st15 \
  --mnk 1,256,128 --mnk 5,640,384 --mnk 16,4096,2048 > $OUT/racecheck_m16n64.log 2>&1; echo "racecheck m16n64 rc=$? $(tail -n 2 $OUT/racecheck_m16n64.log | tr '\n' ' ')"
timeout 120 .device/bin/fp8proj tune --check configs/nvidia-h200.json --check-m 1,3,8,12,16 --csv $OUT/gatecheck.csv > $OUT/gatecheck.log 2>&1; echo "gatecheck rc=$? $(tail -n 3 $OUT/gatecheck.log | tr '\n' ' ')"
H200_BUDGET_S=300 bash scripts/h200.sh info tests harness correctness verify sanitize 2>&1 | grep "^\[h200"
