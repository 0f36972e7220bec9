#!/bin/bash
# Session 15, call 7: fp8proj bench and fp8proj layer with the binaries of call 5 (this tree).
cd "$(dirname "$0")/../.."
tar xJf build-pack/s15/bundle_s15.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
H200_BUDGET_S=200 bash scripts/h200.sh bench layer 2>&1 | grep "^\[h200"
