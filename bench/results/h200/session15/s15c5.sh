#!/bin/bash
# Session 15, call 5: validation of branch exp/b-hint (the weight's L2 policy chosen by
# weight_evict_first) with binaries built from it: C API tests, then scripts/h200.sh's GPU
# tests, harness --quick, the issue's correctness sweep, verify and sanitizers.
cd "$(dirname "$0")/../.."
tar xJf build-pack/s15/bundle_s15.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
timeout 60 .device/bin/fp8proj_c_api_tests --gtest_brief=1 > $OUT/c_api.log 2>&1; echo "c_api rc=$? $(tail -n 2 $OUT/c_api.log | tr '\n' ' ')"
H200_BUDGET_S=470 bash scripts/h200.sh info tests harness correctness verify sanitize 2>&1 | grep "^\[h200"
