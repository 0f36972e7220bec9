#!/usr/bin/env bash
# A/B of GEMM harness builds on the GPU: runs each binary in turn, ROUNDS times, with the same
# harness arguments, so that drift (clock, temperature, power cap) hits every build alike.
#   bash scripts/ab.sh ROUNDS BIN_A BIN_B [BIN...] -- [harness args, default: --shapes design --reps 15]
# Logs: $OUT/ab/<basename>.r<round>.log; compare with scripts/ab_compare.py $OUT/ab.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/h200-out}"
[ -d .device/lib ] && export LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rounds=$1; shift
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--shapes design --reps 15)
mkdir -p "$OUT/ab"
nb=${#bins[@]}
for r in $(seq 1 "$rounds"); do
  # Round r starts at build (r - 1) mod n: each build runs first, second, ... in turn, so a
  # drift with the position inside a round (measured: the second of two ~0.8% slower) averages out.
  for i in $(seq 0 $((nb - 1))); do
    b=${bins[$(((i + r - 1) % nb))]}
    t0=$SECONDS
    "$b" "${args[@]}" >"$OUT/ab/$(basename "$b").r$r.log" 2>&1
    echo "round $r $(basename "$b") rc=$? $((SECONDS - t0)) s $(tail -n 1 "$OUT/ab/$(basename "$b").r$r.log")"
  done
done
