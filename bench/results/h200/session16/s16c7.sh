#!/bin/bash
# Session 16, call 7: fp8proj bench and fp8proj layer with the landed binaries (964cad7, call 5's).
cd "$(dirname "$0")/../.."
tar xJf build-pack/s16/bundle_final.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
H200_BUDGET_S=120 bash scripts/h200.sh bench layer 2>&1 | grep "^\[h200"
