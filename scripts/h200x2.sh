#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU H200 machine (kind nvidia-h200-x2), everything in one call:
#   build (unless loadable binaries are carried in .device/bin), the TP tests in both process
#   models, `fp8proj tp check` (threads, procs, and env mode launched by hand as torchrun would),
#   the GLM-5 layer-level prefill table at TP 2 next to TP 1, and the projection table.
# Results: $OUT/results-tp.tgz (logs, CSV/JSON, SUMMARY.md) and $OUT/run-tp.log.
#
#   bash scripts/h200x2.sh [step ...]    steps: info tests check envmode layer bench
#                                               (default: all)
# Each step has its own timeout; expected run time is a few minutes after the build. Within a
# 10-minute limit per command: build (or carry .device/bin) in a first call
# (`bash scripts/h200x2.sh info`), the rest in a second (`... tests check envmode layer bench`).
# NVLink multicast (NVLS) stays off in every process: NCCL_NVLS_ENABLE=0 is exported here and
# the launcher passes it to the ranks it starts.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/h200x2-out}"
R="$(mktemp -d)/results-tp"
mkdir -p "$R" "$OUT"
finish() {
  summarize
  tar czf "$OUT/results-tp.tgz" -C "$(dirname "$R")" results-tp
  cp "$R/run.log" "$OUT/run-tp.log" 2>/dev/null
}
trap finish EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export FP8PROJ_NCCL_TIMEOUT_S="${FP8PROJ_NCCL_TIMEOUT_S:-120}"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(info tests check envmode layer bench)
STEP_TAG=h200x2 STEP_TAIL=40
source scripts/steps.sh
summarize() {
  [ -d "$R" ] || return 0
  {
    echo "# fp8proj tensor parallelism on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) x$(nvidia-smi -L 2>/dev/null | wc -l)"
    echo
    echo "binaries: $("$FP8" info 2>/dev/null | head -1), $(date -u +%Y-%m-%dT%H:%M:%SZ); full logs, CSV and JSON beside this file."
    for f in tp_tests check_threads check_procs check_env_rank0 layer_threads layer_procs bench; do
      [ -f "$R/$f.log" ] || continue
      echo; echo "## $f"; echo; echo '```'
      grep -E "PASS|FAIL|SKIP|tp check:|fp8proj_tp_tests:|MLA prefill|seqs|^ +[0-9]+ +[0-9]+ \||^ +[0-9]+ \||TP 1 |error" "$R/$f.log" | head -80
      echo '```'
    done
  } >"$R/SUMMARY.md" 2>/dev/null
}

# ---- binaries: carried or built here ----
BIN=.device/bin
# The binaries find the tuned tables in share/fp8proj/configs next to their bin/ (as installed).
mkdir -p .device/share/fp8proj && ln -sfn "$PWD/configs" .device/share/fp8proj/configs
# OpenBLAS (and its gfortran runtime) travel with carried binaries built on another distro.
[ -d .device/lib ] && export LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
loadable() { [ -x "$1" ] && ! ldd "$1" | grep -q "not found"; }
if loadable "$BIN/fp8proj" && loadable "$BIN/fp8proj_tp_tests" && "$BIN/fp8proj" tp --help >/dev/null 2>&1; then
  log "using carried binaries in $BIN"
else
  log "building (carried binaries missing or not loadable here)"
  export PATH=/usr/local/cuda/bin:$PATH
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  # The same build folder and configuration as scripts/h200.sh: after it, only the TP targets build.
  BUILD="${FP8PROJ_BUILD_DIR:-build-h200}"
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release >"$R/configure.log" 2>&1 || { tail -30 "$R/configure.log"; exit 1; }
  grep -i nccl "$R/configure.log" | tee -a "$R/run.log"
  t0=$SECONDS
  cmake --build "$BUILD" -j "$(nproc)" --target fp8proj_cli fp8proj_tp_tests >"$R/build.log" 2>&1 ||
    { grep -E "error|Error" "$R/build.log" | head -40; exit 1; }
  log "built in $((SECONDS - t0)) s"
  mkdir -p "$BIN"
  cp "$BUILD"/tools/fp8proj/fp8proj "$BUILD"/tests/gpu/fp8proj_tp_tests "$BIN"/
fi
FP8=$BIN/fp8proj

# ---- NCCL: opened at run time; find it if the loader does not ----
if ! "$FP8" tp id >/dev/null 2>"$R/nccl_probe.log"; then
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -f "$lib" ] || lib=$(find / -xdev -name 'libnccl.so.2' 2>/dev/null | head -1)
  if [ -n "$lib" ]; then
    export FP8PROJ_NCCL_LIBRARY="$lib"
    log "NCCL from $lib"
  else
    log "no libnccl.so.2 found: $(cat "$R/nccl_probe.log")"
  fi
fi

want info && {
  { nvidia-smi; nvidia-smi topo -m; nvidia-smi -q -d CLOCK | head -40; "$FP8" info; "$FP8" tp id | cut -c1-16;
    env | grep -E "^(NCCL|FP8PROJ)_" ; } >"$R/info.log" 2>&1
  tail -n 20 "$R/info.log"
  run explain 120 "$FP8" tp explain --tp 1,2 --fp8 --m 1,512,513,4096
}
# TP 2 == TP 1 for the projections and the MLA block, both process models, plus the error paths.
want tests && run tp_tests 300 "$BIN/fp8proj_tp_tests" --tp 2 --mode both
want check && {
  run check_threads 240 "$FP8" tp check --tp 2 --mode threads --model glm5 --model deepseek-v3
  run check_procs 180 "$FP8" tp check --tp 2 --mode procs --model glm5
}
# One process per GPU started by hand, as torchrun would: RANK / WORLD_SIZE / LOCAL_RANK and the
# NCCL id handed over as hex in FP8PROJ_NCCL_ID.
want envmode && {
  # As torchrun/mpirun start ranks: rank/world from RANK/WORLD_SIZE/LOCAL_RANK, the NCCL id
  # handed over by a file that rank 0 writes. (An id made by a separate `fp8proj tp id`
  # process is only good while that process lives: the id names its bootstrap socket.)
  idfile="$(mktemp -d)/nccl_id"
  log "start env mode (torchrun-style variables, FP8PROJ_NCCL_ID_FILE=$idfile)"
  pids=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r FP8PROJ_NCCL_ID_FILE="$idfile" timeout --kill-after=10 180 \
      "$FP8" tp check --tp 2 --mode env --what proj --m 1,1024 >"$R/check_env_rank$r.log" 2>&1 &
    pids+=($!)
  done
  rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  log "end env mode rc=$rc"; tail -n 20 "$R/check_env_rank0.log"
}
# The GLM-5 layer-level prefill table: TP 1 next to TP 2, flag off vs on.
want layer && {
  run layer_threads 240 "$FP8" tp layer --tp 2 --mode threads --model glm5 \
    --csv "$R/layer_tp2_glm5.csv" --json "$R/layer_tp2_glm5.json"
  run layer_procs 180 "$FP8" tp layer --tp 2 --mode procs --model glm5 --seqs 4,16 \
    --csv "$R/layer_tp2_glm5_procs.csv" --json "$R/layer_tp2_glm5_procs.json"
}
want bench && run bench 240 "$FP8" tp bench --tp 2 --mode threads --model glm5 \
  --csv "$R/bench_tp2_glm5.csv" --json "$R/bench_tp2_glm5.json"

log "done; results in $OUT/results-tp.tgz"
