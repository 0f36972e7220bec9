#!/bin/bash
# session 12, call 4: main (5df2d27) binaries: GPU tests, C API tests, harness quick + the issue's
# correctness sweep, bench, layer, verify, sanitizers.
tar xJf build-pack/bundle.txz
export LD_LIBRARY_PATH=$PWD/.device/lib
timeout 60 .device/bin/fp8proj_c_api_tests --gtest_brief=1 > $OUT/c_api.log 2>&1; echo "c_api rc=$? $(tail -n 2 $OUT/c_api.log | tr '\n' ' ')"
H200_BUDGET_S=470 bash scripts/h200.sh info tests harness correctness bench layer verify sanitize 2>&1 | grep "^\[h200" 
