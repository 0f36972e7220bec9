#!/usr/bin/env bash
# One run on an H200 (or any sm_90 machine), everything in one command:
#   configure + build (Release, sm_90a, all cores) unless prebuilt binaries are carried in
#   .device/bin and load here; GPU tests; verify; benchmarks; tuning; sanitizers.
# Results: $OUT/results.tgz (logs, CSV/JSON) and $OUT/run.log ($OUT defaults to ./h200-out;
# everything but the step log travels inside the archive). scripts/README.md has the workflow.
#
#   bash scripts/h200.sh [step ...]      steps: info tests tests3 verify bench layer tune check
#                                               check_loop hunt_h200_build harness correctness design sanitize
#                                               sanitize_matrix profile python
#                                               ntail layer_dense decode_policy layer_residual
#                                               faults sanitize_all tune_dense deepgemm_ntail
#                                               python_overhead python_tests python_bench soak
#                                               python_fp8ckpt python_decode pdl_ab layer_ab floor
#                                               retime table_ab
#                                               (default: info tests verify bench layer harness
#                                               sanitize)
# Each step has its own timeout so that one hang cannot eat the whole budget.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/h200-out}"
R="$(mktemp -d)/results"
mkdir -p "$R" "$OUT"
finish() { tar czf "$OUT/results.tgz" -C "$(dirname "$R")" results; cp "$R/run.log" "$OUT/" 2>/dev/null; }
trap finish EXIT
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on shared machines
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(info tests verify bench layer harness sanitize)
# profile: Nsight Compute on the GEMM (large-M tile and small-M swap-AB), clocks left alone.
# The whole run must end (and write its archive) within H200_BUDGET_S (a GPU machine's
# command limit is typically 10 minutes).
DEADLINE=$((SECONDS + ${H200_BUDGET_S:-540}))
STEP_TAG=h200
source scripts/steps.sh

# ---- builds that overlap the C++ build (CPU only; waited for before any GPU step) ----
# python: the package (its own CMake build of the library, build-h200-python); deepgemm_ntail:
# DeepGEMM built and its kernels JIT-compiled for the N-tail shapes.
pip_i='python3 -m pip install "$@" || python3 -m pip install --break-system-packages "$@"'
DG_NTAIL_SHAPES="2624,6144;2112,7168"
bg=()
if want python || want python_tests || want python_bench || want python_overhead || want python_fp8ckpt ||
  want python_decode; then
  # A carried wheel of this tree (pip wheel . -w .whl on another machine: the package is
  # py3-none, its torch ops target the stable ABI of torch 2.10 and later) is installed as it is;
  # otherwise the package is built here.
  wheel=$(ls .whl/fp8proj-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    run python_install 120 bash -c "$pip_i" _ --no-deps --no-index --force-reinstall "$wheel" >/dev/null &
  else
    [ -d .whl ] && bash -c "$pip_i" _ --quiet --no-index --find-links .whl scikit-build-core pathspec packaging >/dev/null 2>&1
    run python_install 420 env CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" PATH="/usr/local/cuda/bin:$PATH" \
      bash -c "$pip_i" _ --no-build-isolation --no-deps -C build-dir=build-h200-python . >/dev/null &
  fi
  bg+=($!)
fi
if want deepgemm_ntail && [ -f build-pack/deepgemm-src.txz ]; then
  PREPARE_ONLY=1 DG_SHAPES="$DG_NTAIL_SHAPES" OUT="$R/deepgemm" run deepgemm_prepare 420 \
    bash scripts/h200_deepgemm.sh >/dev/null &
  bg+=($!)
fi

# ---- binaries: carried or built here ----
BIN=.device/bin
# The binaries find the tuned tables in share/fp8proj/configs next to their bin/ (as installed).
mkdir -p .device/share/fp8proj && ln -sfn "$PWD/configs" .device/share/fp8proj/configs
# OpenBLAS (and its gfortran runtime) travel with carried binaries built on another distro.
[ -d .device/lib ] && export LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -x "$BIN/fp8proj" ] && ! ldd "$BIN/fp8proj" | grep -q "not found" && "$BIN/fp8proj" info >/dev/null 2>&1; then
  log "using carried binaries in $BIN"
else
  log "building (carried binaries missing or not loadable here)"
  export PATH=/usr/local/cuda/bin:$PATH
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B build-h200 "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >"$R/configure.log" 2>&1 || { tail -30 "$R/configure.log"; exit 1; }
  t0=$SECONDS
  # shellcheck disable=SC2086  # H200_BUILD_TARGETS is a list of targets
  cmake --build build-h200 -j "$(nproc)" ${H200_BUILD_TARGETS:+--target $H200_BUILD_TARGETS} >"$R/build.log" 2>&1 || { grep -E "error|Error" "$R/build.log" | head -40; exit 1; }
  log "built in $((SECONDS - t0)) s"
  mkdir -p "$BIN"
  cp build-h200/tools/fp8proj/fp8proj build-h200/tests/fp8proj_cpu_tests build-h200/tests/gpu/fp8proj_gpu_tests "$BIN"/ 2>/dev/null
  [ -x build-h200/tests/gpu/sm90_fp8_gemm_harness ] && cp build-h200/tests/gpu/sm90_fp8_gemm_harness "$BIN"/
  # The C ABI tests and the fault probes (steps faults, sanitize_all); the .so next to them.
  cp build-h200/tests/gpu/fp8proj_c_api_tests build-h200/tests/gpu/fp8proj_fault_probe_layer \
     build-h200/tests/gpu/fp8proj_fault_probe_capi build-h200/tests/gpu/libfp8proj_fault_inject.so "$BIN"/ 2>/dev/null
  cp build-h200/src/libfp8proj_c.so* "$BIN"/ 2>/dev/null
fi
export LD_LIBRARY_PATH="$PWD/$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
FP8=$BIN/fp8proj
for p in "${bg[@]}"; do wait "$p"; done

want info && {
  # The binaries' version stamp (fp8proj info, first line) names their commit; the git metadata
  # of a device copy of the tree can be older than its files, so it is not printed.
  { nvidia-smi; nvidia-smi -q -d CLOCK,POWER | head -60; lscpu | grep -E "Model name|^CPU\(s\)|MHz"; "$FP8" info; } \
    >"$R/info.log" 2>&1
  # ECC counters, remapped rows and the kernel log's Xid lines, before and after the run: a device
  # fault with a hardware cause shows there (docs/robustness.md, the fault hunt).
  gpu_health() { nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT; dmesg 2>/dev/null | grep -iE "xid|nvrm" | tail -20; }
  gpu_health >"$R/gpu_health_before.log" 2>&1
  trap 'gpu_health >"$R/gpu_health_after.log" 2>&1; finish' EXIT
  "$FP8" info | head -20
}
want tests && {
  run gpu_tests 420 "$BIN/fp8proj_gpu_tests" --gtest_output="xml:$R/gpu_tests.xml"
  # Checkpoint tests need the fixtures CTest writes first; CI runs them.
  run cpu_tests 120 "$BIN/fp8proj_cpu_tests" --gtest_brief=1 --gtest_filter=-Checkpoint*
}
want harness && [ -x "$BIN/sm90_fp8_gemm_harness" ] && {
  run harness_quick 240 "$BIN/sm90_fp8_gemm_harness" --quick
}
# correctness: the GEMM correctness sweep (M tails x the six model shapes of docs/design.md and
# N, K samples up to 24576 x 16384), every configuration, no timing.
want correctness && [ -x "$BIN/sm90_fp8_gemm_harness" ] && \
  run harness_correctness 300 "$BIN/sm90_fp8_gemm_harness" --shapes correctness --no-timing
# design: every kernel configuration timed on the six model shapes (BEST/SUMMARY lines).
want design && [ -x "$BIN/sm90_fp8_gemm_harness" ] && \
  run harness_design 240 "$BIN/sm90_fp8_gemm_harness" --shapes design --reps 15
# tune_dense: the rows of fused_qkv_a and kv_b_proj (GLM-5 and DeepSeek-V3, TP 1/2/4/8; fused_qkv_a
# is replicated, the same shape at every TP) into a table of their own, which
# scripts/merge_tuned.py adds to the shipped one.
DENSE_SHAPES=2624x6144,2112x7168,28672x512,14336x512,7168x512,3584x512,32768x512,16384x512,8192x512,4096x512
want tune_dense && run tune_dense 300 "$FP8" tune --shape "$DENSE_SHAPES" --budget "${TUNE_DENSE_BUDGET:-170}" \
  --out "$R/tune_dense.json" --csv "$R/tune_dense.csv" --md "$R/tune_dense.md"
# This GPU's table file (src/tune/table.cpp tune_file_name: lower-case alphanumerics, any other
# run as one '-'): nvidia-h200.json, nvidia-h100-80gb-hbm3.json.
GPU_TABLE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
  tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//').json
[ "$GPU_TABLE" = ".json" ] && GPU_TABLE=nvidia-h200.json
want tune && run tune 420 "$FP8" tune --model glm5,deepseek-v3 --tp 1,2,4,8 --out "$R/$GPU_TABLE" \
  --csv "$R/tune.csv" --md "$R/tune.md"
# Later steps measure with the table just made (the layer reads it at construction), else with
# the shipped one named explicitly: carried binaries look for configs/ under the tree they were
# built from, which need not exist here, and without a table the gate falls back to FP8 above
# M = 512 under either policy (a decode step under `all` then stays bf16).
TABLE="configs/$GPU_TABLE"
if [ -s "$R/$GPU_TABLE" ]; then
  TABLE="$R/$GPU_TABLE"
  export FP8PROJ_TUNE_FILE="$TABLE"
elif [ -z "${FP8PROJ_TUNE_FILE:-}" ] && [ -s "configs/$GPU_TABLE" ]; then
  export FP8PROJ_TUNE_FILE="$PWD/configs/$GPU_TABLE"
fi
[ -n "${FP8PROJ_TUNE_FILE:-}" ] && log "using $FP8PROJ_TUNE_FILE"
want bench && run bench 420 "$FP8" bench --csv "$R/bench.csv" --json "$R/bench.json"
want layer && run layer 300 "$FP8" layer --model glm5 --tp 1,4 --seqs 4,8,16,32,64 --seqlen 1024 \
  --csv "$R/layer.csv" --json "$R/layer.json" --md "$R/layer.md"
# ntail: the FP8 GEMM with a partial last 128-row weight block (N % 128 != 0): its GPU tests
# (every configuration forced, guard region past the output, fp64 oracle, bitwise repeat), the
# harness on those shapes (every configuration, correctness + timing), and the gated layer
# against bf16 at fused_qkv_a (2624x6144 GLM-5, 2112x7168 DeepSeek-V3) and kv_a (576).
want ntail && {
  run ntail_tests 240 "$BIN/fp8proj_gpu_tests" --gtest_filter='*NTail*:Backends/Fp8GemmGpu.*:Shapes/WeightQuantGpu.*' \
    --gtest_output="xml:$R/ntail_tests.xml"
  [ -x "$BIN/sm90_fp8_gemm_harness" ] && run ntail_harness 240 "$BIN/sm90_fp8_gemm_harness" --reps 15 \
    --mnk 1,2624,6144 --mnk 16,2624,6144 --mnk 64,2624,6144 --mnk 512,2624,6144 --mnk 4096,2624,6144 \
    --mnk 32768,2624,6144 --mnk 1,2112,7168 --mnk 64,2112,7168 --mnk 4096,2112,7168 --mnk 32768,2112,7168 \
    --mnk 64,576,7168 --mnk 4096,576,7168
  run ntail_bench 300 "$FP8" bench --shape 2624x6144,2112x7168,576x7168 --policy all \
    --m 1,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768 --csv "$R/ntail_bench.csv" --json "$R/ntail_bench.json"
}
# layer_dense: the whole MLA block with every dense GEMM tagged (fused_qkv_a and kv_b_proj too),
# both models, TP 1 and 4 (rank 0's share), C = 4..64 x 1024, policy all: prefill off/on with
# per-stage times, and the decode step (one CUDA graph replay, context 1025) with its error
# against the bf16 step. decode_policy: the same blocks under policy prefill, where the decode
# step must be bit-identical to bf16 ("bitwise equal" column) and within noise of it.
want layer_dense && for model in glm5 deepseek-v3; do
  run "layer_dense_$model" 420 "$FP8" layer --model "$model" --tp 1,4 --seqs 4,8,16,32,64 --seqlen 1024 \
    --fp8-all-dense --policy all --csv "$R/layer_dense_$model.csv" --json "$R/layer_dense_$model.json" \
    --md "$R/layer_dense_$model.md"
done
# layer_residual: the block from the residual stream (input RMSNorm inside fused_qkv_a's input
# pass, fused with its 1x128 quantization on the FP8 path), every dense GEMM tagged.
want layer_residual && for model in glm5 deepseek-v3; do
  run "layer_residual_$model" 300 "$FP8" layer --model "$model" --tp 1,4 --seqs 4,16,64 --seqlen 1024 --no-decode \
    --fp8-all-dense --residual --policy all --csv "$R/layer_residual_$model.csv" --json "$R/layer_residual_$model.json"
done
want decode_policy && for model in glm5 deepseek-v3; do
  run "decode_prefill_$model" 300 "$FP8" layer --model "$model" --tp 1,4 --seqs 4,64 --seqlen 1024 \
    --fp8-all-dense --policy prefill --csv "$R/decode_prefill_$model.csv" --json "$R/decode_prefill_$model.json"
done
# pdl_ab: programmatic dependent launch (FP8PROJ_PDL) off vs on, interleaved A B A B
# (PDL_AB_ROUNDS rounds, default 2): the decode step (one CUDA-graph replay; every dense GEMM
# tagged, policy all; both blocks' kernels change mode, so both columns are compared across the
# two settings) for DeepSeek-V3 and GLM-5 at TP 1 and 8, C = 16 and 64; and `bench` at small M
# on the two models' TP1 and TP8 shards (full path = quantization + GEMM, and the GEMM alone).
# scripts/pdl_ab.py writes $R/pdl_ab/summary.md: medians per setting and the ratio off/on.
want pdl_ab && {
  mkdir -p "$R/pdl_ab"
  for round in $(seq 1 "${PDL_AB_ROUNDS:-2}"); do
    for pdl in 0 1; do
      for model in deepseek-v3 glm5; do
        FP8PROJ_PDL=$pdl run "pdl_ab_layer_${model}_pdl${pdl}_r$round" 120 "$FP8" layer --model "$model" --tp 1,8 \
          --seqs 16,64 --seqlen 1024 --fp8-all-dense --policy all --csv "$R/pdl_ab/layer_${model}_pdl${pdl}_r$round.csv" \
          >/dev/null
      done
      FP8PROJ_PDL=$pdl run "pdl_ab_bench_pdl${pdl}_r$round" 120 "$FP8" bench --model deepseek-v3,glm5 --tp 1,8 \
        --m 1,4,16,32,64 --policy all --csv "$R/pdl_ab/bench_pdl${pdl}_r$round.csv" >/dev/null
    done
  done
  python3 scripts/pdl_ab.py "$R/pdl_ab" --md "$R/pdl_ab/summary.md" --csv "$R/pdl_ab/summary.csv"
}
# layer_ab: this tree's `fp8proj layer` against another build's ($LAYER_AB_BASE, e.g. main's CLI
# carried as .device/bin/fp8proj_prev), interleaved per model and round (LAYER_AB_ROUNDS, default
# 2): the decode step (one CUDA-graph replay; every dense GEMM tagged, policy all) of DeepSeek-V3
# and GLM-5 at TP 1 and 8, C = 16 and 64, with LAYER_AB_ARGS (default --no-prefill: the step
# alone). scripts/layer_ab.py writes $R/layer_ab/summary.md: per point and build the medians, the
# flag's speedup and each build's time against the base's.
# retime: this GPU's shipped table re-timed with its own configurations (`fp8proj tune --retime`,
# every bucket, RETIME_REPS calls each, default 30): bf16, quantize + GEMM and the GEMM alone
# (fp8_gemm_us: the verdict behind a norm that writes the FP8 input) in the same rounds. The new
# table and its markdown go to $R/retime/; a later table_ab step compares the two.
want retime && {
  mkdir -p "$R/retime"
  run retime 420 "$FP8" tune --retime "configs/$GPU_TABLE" --reps "${RETIME_REPS:-30}" \
    --out "$R/retime/$GPU_TABLE" --md "$R/retime/retime.md"
}
# table_ab: the decode step with the shipped table (label `shipped`) against another one
# (TABLE_AB_NEW, default the retime step's; label TABLE_AB_LABEL, default `retimed`), interleaved per model and round
# (TABLE_AB_ROUNDS, default 2); same points and summary as layer_ab, plus `explain` of the
# projections at decode M under both tables.
want table_ab && {
  mkdir -p "$R/table_ab"
  new_table=${TABLE_AB_NEW:-$R/retime/$GPU_TABLE}
  if [ ! -s "$new_table" ]; then
    log "skip table_ab: no second table ($new_table)"
  else
    other=${TABLE_AB_LABEL:-retimed}
    table_of() { if [ "$1" = "$other" ]; then echo "$new_table"; else echo "$PWD/configs/$GPU_TABLE"; fi; }
    for label in shipped "$other"; do
      FP8PROJ_TUNE_FILE=$(table_of "$label") run "table_ab_explain_$label" 60 "$FP8" explain --model glm5,deepseek-v3 --tp 1,8 \
        --m 1,16,32,64 --fp8 --policy all
    done
    for round in $(seq 1 "${TABLE_AB_ROUNDS:-2}"); do
      for model in deepseek-v3 glm5; do
        for label in shipped "$other"; do
          FP8PROJ_TUNE_FILE=$(table_of "$label") run "table_ab_${model}_${label}_r$round" 120 "$FP8" layer --model "$model" --tp 1,8 \
            --seqs 16,64 --seqlen 1024 --fp8-all-dense --policy all --reps 50 --no-prefill \
            --json "$R/table_ab/layer_${model}_${label}_r$round.json" >/dev/null
        done
      done
    done
    python3 scripts/layer_ab.py "$R/table_ab" --base shipped --md "$R/table_ab/summary.md" --csv "$R/table_ab/summary.csv"
  fi
}
want layer_ab && {
  mkdir -p "$R/layer_ab"
  if [ -z "${LAYER_AB_BASE:-}" ] || [ ! -x "${LAYER_AB_BASE}" ]; then
    log "skip layer_ab: LAYER_AB_BASE (the other build's fp8proj) is not set or not executable"
  else
    for round in $(seq 1 "${LAYER_AB_ROUNDS:-2}"); do
      for model in deepseek-v3 glm5; do
        for label in base new; do
          bin=$FP8; [ $label = base ] && bin=$LAYER_AB_BASE
          # shellcheck disable=SC2086  # LAYER_AB_ARGS is a list of options
          run "layer_ab_${model}_${label}_r$round" 120 "$bin" layer --model "$model" --tp 1,8 --seqs 16,64 \
            --seqlen 1024 --fp8-all-dense --policy all --reps 50 ${LAYER_AB_ARGS---no-prefill} \
            --json "$R/layer_ab/layer_${model}_${label}_r$round.json" >/dev/null
        done
      done
    done
    python3 scripts/layer_ab.py "$R/layer_ab" --md "$R/layer_ab/summary.md" --csv "$R/layer_ab/summary.csv"
  fi
}
# floor: where a small-M FP8 GEMM's time goes (docs/decode.md). `fp8proj floor` over every shipped
# shape (GLM-5 and DeepSeek-V3 dense GEMMs, TP 1/2/4/8; 26 shapes) at M 1,4,16,32,64: the call
# eager and in graph replay, the empty kernel, the weight read, the floor; then Nsight Compute
# (clocks left alone) over one launch of each kernel at M 1,16,64 (`--launch-once`), and
# scripts/floor_table.py joins the two into results/floor/floor.md.
want floor && {
  mkdir -p "$R/floor"
  # First the command checked end to end on two small shapes (tests/scripts/test_floor_cli.py).
  run floor_cli_test 120 python3 tests/scripts/test_floor_cli.py "$FP8"
  run floor 300 "$FP8" floor --m 1,4,16,32,64 --csv "$R/floor/floor.csv" --json "$R/floor/floor.json"
  command -v ncu >/dev/null && {
    run floor_ncu 240 ncu --clock-control none -k regex:'sm90_fp8|activation_quant|floor_' \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,sm__cycles_active.avg,sm__throughput.avg.pct_of_peak_sustained_elapsed \
      -f -o "$R/floor/ncu" "$FP8" floor --launch-once --m 1,16,64 --csv "$R/floor/launches.csv"
    ncu --import "$R/floor/ncu.ncu-rep" --csv --page raw --print-units base >"$R/floor/ncu.csv" 2>"$R/floor/ncu_import.log"
  }
  ncu_args=(); [ -s "$R/floor/ncu.csv" ] && ncu_args=(--manifest "$R/floor/launches.csv" --ncu "$R/floor/ncu.csv")
  # An ncu export the table cannot read leaves the timed columns: the table without ncu.
  [ -s "$R/floor/floor.csv" ] && { python3 scripts/floor_table.py --floor "$R/floor/floor.csv" "${ncu_args[@]}" \
    --md "$R/floor/floor.md" || python3 scripts/floor_table.py --floor "$R/floor/floor.csv" --md "$R/floor/floor.md"; } \
    && tail -n 12 "$R/floor/floor.md"
}
want verify && run verify 180 "$FP8" verify --case 1x256x384 --case 17x384x256 --case 300x2048x1536 \
  --case 129x6144x2048 --case 1000x4096x2048 --case 4097x2048x1536 --case 33x2624x6144 --case 300x2112x7168 \
  --case 5x576x512
want check && run gatecheck 300 "$FP8" tune --check "$TABLE" --csv "$R/gatecheck.csv"
# check_loop: CHECK_RUNS (10) back-to-back `tune --check` processes of the shipped table at the M
# values of the intermittent-fault report (docs/robustness.md), each its own process; a run that
# exits with a CUDA error counts as a fault (its log is kept), a timing verdict does not.
want check_loop && {
  faults=0
  for i in $(seq 1 "${CHECK_RUNS:-10}"); do
    run "check_loop_$i" 120 "$FP8" tune --check "$TABLE" --check-m 3,37,333,777,1111,2222,5555,9999 --no-fail \
      --csv "$R/check_loop_$i.csv" >/dev/null
    rc=$?
    grep -q "CUDA error" "$R/check_loop_$i.log" && faults=$((faults + 1))
    [ $rc -ne 0 ] && log "check_loop_$i rc=$rc"
  done
  log "check_loop: ${CHECK_RUNS:-10} back-to-back tune --check runs, $faults with a CUDA error"
}
# hunt_h200_build: the fault hunt's build hypothesis. This tree built with this machine's own
# toolchain (build-h200-native), its device code compared with the binaries in use (SASS md5 of
# libfp8proj_c.so), then HUNT_ROUNDS (9) rounds of the reported sequence on the native binaries:
# layer, bench, the full tune --check (docs/robustness.md, the open launch failure).
want hunt_h200_build && {
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  run native_build 400 bash -c "cmake -S . -B build-h200-native ${gen[*]} -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build-h200-native -j $(nproc) >/dev/null"
  NAT=build-h200-native/tools/fp8proj/fp8proj
  if [ -x "$NAT" ]; then
    for f in build-h200-native/src/libfp8proj_c.so "$BIN/libfp8proj_c.so"; do
      printf '%s %s\n' "$(cuobjdump -sass "$f" | grep -vE 'Fatbin|code for|arch =|host =|compile_size|identifier|^\s*$' | md5sum | cut -c1-32)" "$f"
    done >"$R/sass_md5.txt"
    { g++ --version | head -1; cmake --version | head -1; "$NAT" info | head -1; } >>"$R/sass_md5.txt"
    faults=0
    for i in $(seq 1 "${HUNT_ROUNDS:-9}"); do
      run "hunt_${i}_layer" 120 "$NAT" layer --model deepseek-v3 --tp 1,8 --seqs 16,64 --fp8-all-dense --policy all >/dev/null
      run "hunt_${i}_bench" 120 "$NAT" bench >/dev/null
      run "hunt_${i}_check" 120 "$NAT" tune --check "$TABLE" --check-m 3,37,333,777,1111,2222,5555,9999 --no-fail \
        --csv "$R/hunt_${i}_check.csv" >/dev/null
      faults=$((faults + $(grep -l "CUDA error" "$R"/hunt_"${i}"_*.log 2>/dev/null | wc -l)))
    done
    log "hunt_h200_build: ${HUNT_ROUNDS:-9} rounds on binaries built here, $faults processes with a CUDA error"
  fi
}
# tests3: the GPU tests three times in a row (each a fresh process).
want tests3 && for i in 1 2 3; do
  run "gpu_tests_$i" 300 "$BIN/fp8proj_gpu_tests" --gtest_brief=1 --gtest_output="xml:$R/gpu_tests_$i.xml" >/dev/null
done
want check && {  # a corrupt and a mismatched table are rejected with one line; the layer still works
  echo '{not json' >"$R/bad.json"
  other="NVIDIA H100 80GB HBM3"  # a table stamped for a GPU this one is not
  [ "$GPU_TABLE" = nvidia-h100-80gb-hbm3.json ] && other="NVIDIA H200"
  python3 -c "import json,sys;t=json.load(open(sys.argv[1]));t['stamp']['gpu_name']=sys.argv[3];json.dump(t,open(sys.argv[2],'w'))" \
    "$TABLE" "$R/other_gpu.json" "$other" 2>/dev/null
  for f in bad other_gpu; do
    FP8PROJ_TUNE_FILE="$R/$f.json" "$FP8" explain --fp8 --model glm5 --tp 1 --m 1,4096 >"$R/reject_$f.log" 2>&1
    echo "rc=$?" >>"$R/reject_$f.log"
  done
  FP8PROJ_TUNE_FILE="$TABLE" "$FP8" explain --fp8 --policy all --model glm5,deepseek-v3 --tp 1,4 \
    --m 1,16,64,200,700,1500,4096,32768 >"$R/explain_tuned.log" 2>&1
}
want sanitize && command -v compute-sanitizer >/dev/null && {
  # The GEMM watchdog off (FP8PROJ_WATCHDOG_MS=0) under the tools: they stretch every barrier
  # wait far past its microseconds; the steps' own timeouts bound a hang here.
  export FP8PROJ_WATCHDOG_MS=0
  # memcheck over the GPU tests (minus the exhaustive 2^32-input conversions and the timing
  # loops, which only repeat what is checked elsewhere) and over the GEMM harness on a small
  # and a large shape; racecheck on the harness (the shared-memory pipelines). 2304 x 4096
  # has >= 2 tiles per SM for every tile size, so the carrying (_c) kernels run too.
  run memcheck_tests 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/fp8proj_gpu_tests" \
    --gtest_filter='-*HardwareCvt*:*Speed*:*Bandwidth*'
  [ -x "$BIN/sm90_fp8_gemm_harness" ] && {
    run memcheck_gemm 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/sm90_fp8_gemm_harness" \
      --no-timing --mnk 100,640,384 --mnk 33,2048,1536 --mnk 4097,6144,2048
    run racecheck_gemm 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/sm90_fp8_gemm_harness" \
      --no-timing --mnk 100,640,384 --mnk 1000,2048,1024 --mnk 2304,4096,256
  }
  unset FP8PROJ_WATCHDOG_MS
}
# sanitize_matrix: racecheck, synccheck, initcheck and memcheck over every configuration of the
# GEMM family forced one at a time (full and partial last tiles, N tails, K = 512, the per-K
# kernels, clusters with a spare tile, carrying kernels, split-K) and over the other kernels'
# GPU tests: scripts/sanitize_matrix.py, matrix.md / matrix.csv under results/sanitize_matrix/.
want sanitize_matrix && command -v compute-sanitizer >/dev/null && [ -x "$BIN/sm90_fp8_gemm_harness" ] && \
  run sanitize_matrix "${SANITIZE_MATRIX_S:-480}" python3 scripts/sanitize_matrix.py --harness "$BIN/sm90_fp8_gemm_harness" \
    --gpu-tests "$BIN/fp8proj_gpu_tests" --out "$R/sanitize_matrix" --jobs "${SANITIZE_JOBS:-12}" \
    --timeout "${SANITIZE_JOB_S:-240}"
# soak: `fp8proj soak` for SOAK_MINUTES (default 4) from SOAK_SEED (default 1): seeded random
# shapes, M, paths, sm90 configurations, streams, CUDA graphs and L2 flushes, every output checked
# (docs/robustness.md, "The soak"); SOAK_ARGS adds options, e.g. the hammer on one launch
# "--shapes 24576x1536 --m 777 --configs m128n192_ws2_st4 --paths fp8". The step's timeout leaves
# 2 minutes past the soak's own end for the layers' set-up and the last iteration.
want soak && run soak "$(awk -v m="${SOAK_MINUTES:-4}" 'BEGIN { printf "%d", m * 60 + 120 }')" \
  "$FP8" soak --minutes "${SOAK_MINUTES:-4}" --seed "${SOAK_SEED:-1}" --json "$R/soak.json" --log "$R/soak_iterations.log" \
  ${SOAK_ARGS:-}
# faults: the layer and the C ABI under tuned-table faults, a sticky CUDA fault (every surface,
# the torch ops where the package imports, fails fast with its text) and a hung GEMM kernel (the
# watchdog ends it, naming it): tests/gpu/test_faults.py.
want faults && [ -x "$BIN/fp8proj_fault_probe_layer" ] && \
  run faults 300 python3 tests/gpu/test_faults.py "$BIN/fp8proj_fault_probe_layer" "$BIN/fp8proj_fault_probe_capi" \
    "$BIN/libfp8proj_fault_inject.so"
want profile && command -v ncu >/dev/null && [ -x "$BIN/sm90_fp8_gemm_harness" ] && {
  run ncu_large 120 ncu --clock-control none -k regex:sm90_fp8_gemm --launch-count 2 --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats "$BIN/sm90_fp8_gemm_harness" --no-timing --mnk 8192,6144,16384
  run ncu_small 120 ncu --clock-control none -k regex:sm90_fp8_gemm --launch-count 2 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats "$BIN/sm90_fp8_gemm_harness" --no-timing \
    --mnk 16,4096,2048
}

# python: the package built from this tree with the machine's torch (offline: scikit-build-core,
# pathspec and packaging travel as wheels in .whl/), its pytest suite with the GPU tests
# (python_tests), and python -m fp8proj.bench (python_bench: per-call overhead; the transformers
# model, flag off vs on; PY_BENCH_ARGS adds its options, e.g. "--reps 15").
{ want python || want python_tests || want python_bench || want python_overhead || want python_fp8ckpt ||
  want python_decode; } && \
  tail -n 5 "$R/python_install.log"
{ want python || want python_tests; } && run python_tests 300 python3 -m pytest -q -rs python/tests
{ want python || want python_bench; } && run python_bench 420 python3 -m fp8proj.bench --out "$R/python_bench" ${PY_BENCH_ARGS:-}
# python_overhead: the package's op-registration check (opcheck) and the per-call overhead part
# of fp8proj.bench alone.
want python_overhead && {
  run python_opcheck 200 python3 -m pytest -q -rs python/tests/test_gpu.py -k opcheck
  run python_overhead 200 python3 -m fp8proj.bench --out "$R/python_overhead" --parts overhead
}
# python_fp8ckpt: FP8 checkpoints as users load them (python/fp8proj/bench_fp8ckpt.py): fp8proj
# against dequantize=True (bf16) and against DeepGEMM through the module interface transformers
# uses, where DeepGEMM is built here (build-pack/deepgemm-src.txz, as deepgemm_ntail builds it; its
# kernels JIT-compiled ahead by the benchmark in 12 processes). The checkpoints are kept in
# build-fp8ckpt/ between calls on a warm machine. PY_FP8CKPT_ARGS adds options, e.g.
# "--models glm5" (one model per call keeps a call under the 10-minute limit).
want python_fp8ckpt && {
  dg=$PWD/build-deepgemm/DeepGEMM
  if [ -f build-pack/deepgemm-src.txz ] && [ ! -f "$dg/deep_gemm/.built" ]; then
    PREPARE_ONLY=1 DG_SHAPES="$DG_NTAIL_SHAPES" OUT="$R/deepgemm" run deepgemm_prepare 420 bash scripts/h200_deepgemm.sh
  fi
  run python_fp8ckpt 540 env PYTHONPATH="$dg${PYTHONPATH:+:$PYTHONPATH}" DG_JIT_CACHE_DIR="$PWD/build-deepgemm/jit-cache" \
    python3 -m fp8proj.bench --out "$R/python_fp8ckpt" --parts fp8ckpt --ckpt-dir "$PWD/build-fp8ckpt" \
    --dg-prewarm 12 ${PY_FP8CKPT_ARGS:-}
}
# python_decode: the transformers decode step (StaticCache, context 1024, C = 16 and 64) as CUDA
# graphs, bf16 against patch(policy="all", targets=ALL_TARGETS), the attention's share from graphs
# with self_attn stubbed out (python/fp8proj/bench_decode.py). PY_DECODE_ARGS adds options.
want python_decode && run python_decode 540 python3 -m fp8proj.bench --out "$R/python_decode" --parts decode \
  --models glm5,deepseek-v3 --decode 16,64 ${PY_DECODE_ARGS:-}
# deepgemm_ntail: DeepGEMM against our FP8 GEMM and cuBLAS bf16 at fused_qkv_a's shapes (N % 128
# != 0 for us; DeepGEMM takes N % 64 == 0), M from 1 to 32768, same run, same operands.
want deepgemm_ntail && [ -f build-pack/deepgemm-src.txz ] && \
  run deepgemm_ntail 300 env DG_SHAPES="$DG_NTAIL_SHAPES" OUT="$R/deepgemm" FP8PROJ_C_LIB="$PWD/$BIN/libfp8proj_c.so" \
    COMPARE_ARGS="--m 1,16,64,128,256,512,1024,2048,4096,8192,16384,32768" bash scripts/h200_deepgemm.sh

# sanitize_all (last: its processes share the GPU, so nothing is timed after it starts): the
# four compute-sanitizer tools over the GPU tests (minus the exhaustive
# conversions and timing loops), the C ABI tests and the fault probe; one log per tool and
# program under results/ (compute-sanitizer's own summary line ends each).
want sanitize_all && command -v compute-sanitizer >/dev/null && {
  export FP8PROJ_WATCHDOG_MS=0  # as in sanitize: the tools stretch every barrier wait
  gfilter='-*HardwareCvt*:*Speed*:*Bandwidth*'
  # racecheck replays every shared-memory access: over the per-configuration GEMM sweeps
  # (Configs/*, the N-tail heuristic shapes) it would run for an hour, so those configurations
  # get racecheck through the harness below, every configuration once at small K.
  rfilter="$gfilter:Configs/*:Shapes/Sm90NTailHeuristicGpu.*"
  # Each tool's pass over the GPU tests runs as SANITIZE_SHARDS gtest shards at once (separate
  # processes on the one GPU: the tools' cost is mostly host-side), one log per shard.
  shards=${SANITIZE_SHARDS:-3}
  pids=()
  for tool in ${SANITIZE_TOOLS:-memcheck initcheck synccheck racecheck}; do
    extra=(--print-limit 2000); [ "$tool" = memcheck ] && extra+=(--leak-check full)
    f=$gfilter; [ "$tool" = racecheck ] && f=$rfilter
    for i in $(seq 0 $((shards - 1))); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i run "cs_${tool}_gpu_tests_${i}of${shards}" 480 \
        compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 9 "$BIN/fp8proj_gpu_tests" \
        --gtest_filter="$f" >/dev/null &
      pids+=($!)
    done
  done
  [ -x "$BIN/sm90_fp8_gemm_harness" ] && {
    run cs_racecheck_harness_ntail 300 compute-sanitizer --tool racecheck --error-exitcode 9 \
      "$BIN/sm90_fp8_gemm_harness" --no-timing --mnk 100,2624,256 --mnk 2304,2112,256 --mnk 40,576,256 >/dev/null &
    pids+=($!)
  }
  for tool in ${SANITIZE_TOOLS:-memcheck initcheck synccheck racecheck}; do
    [ -x "$BIN/fp8proj_c_api_tests" ] && run "cs_${tool}_c_api" 120 compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$BIN/fp8proj_c_api_tests" >/dev/null
    [ -x "$BIN/fp8proj_fault_probe_capi" ] && FP8PROJ_TUNE_FILE=/nonexistent.json run "cs_${tool}_fault_capi" 60 \
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$BIN/fp8proj_fault_probe_capi" >/dev/null
  done
  for p in "${pids[@]}"; do wait "$p"; done
  grep -H "ERROR SUMMARY\|LEAK SUMMARY\|RACECHECK SUMMARY" "$R"/cs_*.log | tee -a "$R/run.log"
  unset FP8PROJ_WATCHDOG_MS
}
log "done; results in $OUT/results.tgz"
