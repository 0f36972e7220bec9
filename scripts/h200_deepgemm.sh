#!/usr/bin/env bash
# DeepGEMM next to our FP8 GEMM and cuBLAS bf16 on the GPU machine, in one process
# (scripts/compare_deepgemm.py). The machine has no network, so DeepGEMM comes as source
# (build-pack/deepgemm-src.txz from scripts/pack_deepgemm.sh) and is built here against the
# machine's PyTorch; its kernels are JIT-compiled in parallel first, so that compilation is
# never timed. Results and logs go to $OUT (default h200-out).
#
#   FP8PROJ_C_LIB=path/libfp8proj_c.so  (default: .device/lib, else build/src)
#   FP8PROJ_C_LIB_B=path/libfp8proj_c.so (optional: a second build, interleaved with the first: A/B)
#   FP8PROJ_TUNE_FILE_B=path.json       (optional: B's tuned table, default A's; with the same
#                                        library as A and B this is a table A/B)
#   AB_BOTH_WAYS=1                      (with a B: every even run swaps the two libraries' places;
#                                        each keeps its table; scripts/ab_both_ways.py combines the
#                                        runs into $OUT/ab_both_ways.md. Each library holds its own copy of
#                                        the weights, and at memory-bound points that copy's
#                                        placement alone moved one side by 1-4% with identical SASS
#                                        (docs/kernels.md): decide an A/B both ways round, RUNS even)
#   RUNS=2                              (independent measurement runs, to show the spread)
#   COMPARE_ARGS="--reps 45"            (passed on to compare_deepgemm.py)
#   DG_SHAPES="2624,6144;2112,7168"     (shapes instead of the reference table, for the JIT
#                                        prewarm and the comparison alike)
#   DG_M="1,4,16,32,64"                 (M values instead of the reference list, likewise)
#   PREPARE_ONLY=1                      (build DeepGEMM and JIT-compile its kernels, then stop:
#                                        CPU work that can overlap other builds)
#   NCU_PROBLEM=N,K,M                   (also: Nsight Compute of both kernels at that problem,
#                                        clocks left alone)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
OUT=${OUT:-$repo/h200-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export FP8PROJ_TUNE_FILE=${FP8PROJ_TUNE_FILE:-$repo/configs/nvidia-h200.json}
lib=${FP8PROJ_C_LIB:-}
[[ -z $lib && -f .device/lib/libfp8proj_c.so ]] && lib=$repo/.device/lib/libfp8proj_c.so
[[ -z $lib && -f build/src/libfp8proj_c.so ]] && lib=$repo/build/src/libfp8proj_c.so
[[ -n $lib || ${PREPARE_ONLY:-0} == 1 ]] || { echo "no libfp8proj_c.so: build the fp8proj_c target or set FP8PROJ_C_LIB" >&2; exit 2; }
[[ -f build-pack/deepgemm-src.txz ]] || { echo "no build-pack/deepgemm-src.txz: run scripts/pack_deepgemm.sh" >&2; exit 2; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv \
  | tee "$OUT/gpu.txt"

# DeepGEMM: its Python extension (one C++ file) built against this PyTorch; the CUTLASS/CuTe
# headers linked where its JIT looks for them.
work=${DG_WORK:-$repo/build-deepgemm}  # ignored; kept between calls on a warm machine
if [[ ! -f $work/DeepGEMM/deep_gemm/.built ]]; then
  rm -rf "$work" && mkdir -p "$work"
  tar xJf build-pack/deepgemm-src.txz -C "$work"
  (
    cd "$work/DeepGEMM"
    ln -sfn "$PWD/third-party/cutlass/include/cutlass" deep_gemm/include/cutlass
    ln -sfn "$PWD/third-party/cutlass/include/cute" deep_gemm/include/cute
    start=$SECONDS
    # The image's default CXX (/opt/gcc/bin/g++, a wrapper) built an extension that crashed in
    # its first std::stringstream insertion (seen 2026-11-30); the distribution's g++ does not.
    sys_cxx=()
    [[ -x /usr/bin/g++ ]] && sys_cxx=(CXX=/usr/bin/g++ CC=/usr/bin/gcc)
    env "${sys_cxx[@]}" MAX_JOBS=16 python3 setup.py build >"$OUT/deepgemm_build.log" 2>&1 || { tail -40 "$OUT/deepgemm_build.log"; exit 1; }
    so=$(find build -name '_C*.so' -type f | head -n 1)
    ln -sfn "$PWD/$so" deep_gemm/
    echo "DeepGEMM extension built in $((SECONDS - start)) s"
    touch deep_gemm/.built
  )
fi
export PYTHONPATH=$work/DeepGEMM${PYTHONPATH:+:$PYTHONPATH}
export DG_COMMIT=$(cat "$work/DeepGEMM/COMMIT")
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-$work/jit-cache}
python3 -c 'import deep_gemm, torch; print("deep_gemm", deep_gemm.__version__, "torch", torch.__version__, torch.version.cuda)'

start=$SECONDS
shards=${SHARDS:-12}
mkdir -p "$OUT/prewarm"
shape_args=(); [[ -n ${DG_SHAPES:-} ]] && shape_args=(--shapes "$DG_SHAPES")
[[ -n ${DG_M:-} ]] && shape_args+=(--m "$DG_M")
for i in $(seq 0 $((shards - 1))); do
  python3 scripts/compare_deepgemm.py --prewarm "$i/$shards" "${shape_args[@]}" >"$OUT/prewarm/$i.log" 2>&1 &
done
fail=0
for job in $(jobs -p); do wait "$job" || fail=1; done
(( fail == 0 )) || { tail -30 "$OUT"/prewarm/*.log; exit 1; }
echo "DeepGEMM JIT prewarm: $((SECONDS - start)) s, $(find "$DG_JIT_CACHE_DIR" -name '*.cubin' | wc -l) kernels"
# DeepGEMM's own choice per problem (its heuristic prints it; every kernel is cached by now).
DG_PRINT_CONFIGS=1 python3 scripts/compare_deepgemm.py --prewarm 0/1 "${shape_args[@]}" >"$OUT/deepgemm_configs.log" 2>&1
rm -rf "$OUT/prewarm"
[[ ${PREPARE_ONLY:-0} == 1 ]] && exit 0

both_ways=0
[[ -n ${FP8PROJ_C_LIB_B:-} && ${AB_BOTH_WAYS:-0} == 1 ]] && both_ways=1
for run in $(seq 1 "${RUNS:-1}"); do
  dir=$OUT/run$run
  rm -rf "$dir" && mkdir -p "$dir"
  a=$lib b=${FP8PROJ_C_LIB_B:-} ta=$FP8PROJ_TUNE_FILE tb=${FP8PROJ_TUNE_FILE_B:-$FP8PROJ_TUNE_FILE}
  if (( both_ways && run % 2 == 0 )); then  # reversed: B's build in A's place and the other way
    a=$FP8PROJ_C_LIB_B b=$lib ta=$tb tb=$FP8PROJ_TUNE_FILE
    touch "$dir/swapped"
  fi
  FP8PROJ_TUNE_FILE=$ta python3 scripts/compare_deepgemm.py --lib "$a" ${b:+--lib-b "$b" --tune-file-b "$tb"} \
    --out "$dir" "${shape_args[@]}" ${COMPARE_ARGS:-} 2>&1 | tee "$dir/compare.log"
done
if (( both_ways )); then
  python3 scripts/ab_both_ways.py "$OUT" --csv "$OUT/ab_both_ways.csv" | tee "$OUT/ab_both_ways.md" ||
    echo "ab_both_ways: needs RUNS >= 2 (one run each way)"
fi
if [[ -n ${NCU_PROBLEM:-} ]] && command -v ncu >/dev/null; then
  IFS=, read -r n k m <<<"$NCU_PROBLEM"
  for who in deepgemm:sm90_fp8_gemm_1d2d_impl "fp8proj:sm90_fp8_gemm_(1d2d|swapab)_kernel"; do
    ncu --clock-control none -k "regex:${who#*:}" --launch-skip 2 --launch-count 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --section LaunchStats --section Occupancy \
      --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.max \
      python3 scripts/compare_deepgemm.py --lib "$lib" --shapes "$n,$k" --m "$m" --reps 2 --warmup 1 \
      --out "$OUT/ncu_tmp" >"$OUT/ncu_${who%%:*}_${n}x${k}x${m}.log" 2>&1 || echo "ncu ${who%%:*} failed"
  done
  rm -rf "$OUT/ncu_tmp"
fi
# One archive, easy to carry back from a GPU machine (without the copies of library B
# that compare_deepgemm.py puts in each run directory: 12 MB each).
tar czf "$OUT/deepgemm_compare.tgz" --exclude="*.so" -C "$OUT" $(cd "$OUT" && ls -d run* ncu_*.log deepgemm_configs.log gpu.txt ab_both_ways.* 2>/dev/null)
